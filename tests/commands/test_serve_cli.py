"""``multiminddev serve``: its inputs are checked before anything loads or listens."""

from __future__ import annotations

import pytest

from multiminddev.cli import main
from multiminddev.commands._io import InputError
from multiminddev.commands.serve import parse_adapters

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def adapter_folder(path):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def test_named_adapters_are_parsed(tmp_path):
    a, b = adapter_folder(tmp_path / "a"), adapter_folder(tmp_path / "b")
    assert parse_adapters([f"gen={a}", f"opt={b}"]) == {"gen": str(a), "opt": str(b)}


def test_a_checkpoint_folder_gives_its_role_adapters(tmp_path):
    gen = adapter_folder(tmp_path / "ckpt" / "generator")
    opt = adapter_folder(tmp_path / "ckpt" / "optimizer")
    assert parse_adapters([str(tmp_path / "ckpt")]) == {"generator": str(gen),
                                                        "optimizer": str(opt)}


def test_a_name_given_twice_is_refused(tmp_path):
    a = adapter_folder(tmp_path / "a")
    with pytest.raises(InputError, match="twice"):
        parse_adapters([f"x={a}", f"x={a}"])


def test_a_folder_without_an_adapter_fails_in_one_line(tmp_path, capsys):
    assert main(["serve", "--adapters", f"x={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "adapter_config.json" in err and err.count("\n") == 1


def test_a_missing_model_fails_before_the_server_starts(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path / "none.gguf"), "--adapters"]) == 2
    assert "does not exist" in capsys.readouterr().err


def _serve_args(*argv):
    import argparse

    from multiminddev.commands import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_by_default_the_shipped_agents_drive_the_roles_as_they_were_trained():
    from multiminddev.agents.shipped import shipped_agents
    from multiminddev.commands.serve import serve_config

    shipped = shipped_agents()
    if shipped is None:
        pytest.skip("this installation ships no agents")
    config = serve_config(_serve_args())
    assert config.adapters == shipped.adapter_paths()
    assert set(config.adapters) == {"generator", "optimizer"}
    assert config.element_type_line is shipped.element_type_line


@pytest.mark.parametrize("argv", [["--adapters", "none"], ["--adapters"],
                                  ["--model", "other.gguf"]])
def test_no_shipped_agents_with_other_adapters_or_another_model(argv):
    from multiminddev.commands.serve import serve_config

    config = serve_config(_serve_args(*argv))
    assert config.adapters == {} and config.element_type_line is False
