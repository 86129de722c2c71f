"""``slotmap lab`` refuses every pass-through Jupyter option that sets an empty token (which
turns authentication off), in each spelling Jupyter takes, unless told no authentication is
meant."""

from __future__ import annotations

import pytest

from slotmap.cli import main

REFUSAL = (
    "slotmap lab: an empty token turns authentication off: anyone who can reach the port can "
    "run code as you; pass a token, or add --unsafe-no-auth if you mean it\n"
)
EMPTY_TOKENS = [
    ["--", "--IdentityProvider.token", ""],
    ["--", "--IdentityProvider.token", "''"],
    ["--", "--IdentityProvider.token"],
    ["--", "--PasswordIdentityProvider.token="],
    ["--", "--PasswordIdentityProvider.token", ""],
    ["--", "--ServerApp.token="],
    ["--", "--ServerApp.token", '""'],
    ["--", "--NotebookApp.token= "],
    ["--", "--token="],
    ["--PasswordIdentityProvider.token="],
]


@pytest.mark.parametrize("options", EMPTY_TOKENS, ids=" ".join)
def test_an_empty_token_option_is_refused(options: list[str], capsys) -> None:
    assert main(["lab", "--dry-run", *options]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no command: nothing would start
    assert captured.err == REFUSAL


@pytest.mark.parametrize("options", EMPTY_TOKENS[:3], ids=" ".join)
def test_an_empty_token_option_passes_when_no_authentication_is_meant(options, capsys) -> None:
    assert main(["lab", "--dry-run", "--unsafe-no-auth", *options]) == 0


@pytest.mark.parametrize(
    "options",
    [
        ["--", "--IdentityProvider.token", "abc"],
        ["--", "--PasswordIdentityProvider.token=abc"],
        ["--", "--ServerApp.port_retries=0"],
        ["--", "--ServerApp.token_file", ""],
    ],
    ids=" ".join,
)
def test_other_options_pass(options: list[str], capsys) -> None:
    assert main(["lab", "--dry-run", *options]) == 0
    assert options[-1] in capsys.readouterr().out or options[-1] == ""
