"""docs/guide.md's command blocks: every fenced block is marked (run, run on one cluster, the
variables, or an illustration with its reason), and every `drape` command in any block, run or not,
parses with the real CLI (typer's parser: the command exists, its options exist and take what is
given). tests/integration/test_guide.py executes the blocks marked to run."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer._click.core import Context  # typer 0.29 carries its own click: its parser is the CLI's
from typer._click.exceptions import UsageError

from drape.cli import app

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
KINDS = r"variables|run|run slurm|run kubernetes|illustration: (?P<why>[^>]*\S)"
MARK = re.compile(rf"<!-- guide: ({KINDS}) -->\n```bash\n(?P<code>.*?)\n```", re.S)
FENCE = re.compile(r"^```", re.M)
SHELL_STOPS = {">", ">>", "|", "&&", "||", ";", "2>&1"}


@dataclass(frozen=True)
class Block:
    kind: str  # variables | run | run slurm | run kubernetes | illustration
    code: str
    why: str = ""


def guide_blocks(text: str | None = None) -> list[Block]:
    """The guide's fenced blocks in order; ValueError when a fence is not marked."""
    text = GUIDE.read_text() if text is None else text
    blocks = []
    for match in MARK.finditer(text):
        kind = "illustration" if match.group(1).startswith("illustration") else match.group(1)
        blocks.append(Block(kind, match.group("code"), match.group("why") or ""))
    fences = len(FENCE.findall(text)) // 2
    if fences != len(blocks):
        marked = f"{len(blocks)} of them marked `<!-- guide: … -->` right above a ```bash fence"
        raise ValueError(f"{GUIDE}: {fences} fenced blocks, {marked}")
    return blocks


def drape_commands(code: str) -> list[list[str]]:
    """Each `drape …` command of a shell block, as argv after `drape` ($NAMES kept as words),
    cut at the first redirection or pipe."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["drape"]:
            argv = []
            for word in words[1:]:
                if word in SHELL_STOPS:
                    break
                argv.append(word)
            commands.append(argv)
    return commands


def parses(argv: list[str]) -> None:
    """Parse `argv` with drape's command tree down to the leaf command (drape's groups take no
    options of their own here); the parser's UsageError when a command or an option does not exist,
    a value does not fit its type, or a required one is missing."""
    command = typer.main.get_command(app)
    args, name = list(argv), "drape"
    while hasattr(command, "list_commands"):  # a group
        if not args:
            raise UsageError(f"drape … {name}: no command given")
        name, *args = args
        found = command.get_command(Context(command), name)
        if found is None:
            raise UsageError(f"no such command: drape … {name}")
        command = found
    command.make_context(name, args)


def test_every_block_is_marked_and_an_illustration_says_why():
    blocks = guide_blocks()
    kinds = [block.kind for block in blocks]
    assert kinds.count("variables") == 1 and kinds[0] == "variables"
    assert {"run", "run slurm", "run kubernetes", "illustration"} <= set(kinds)
    for block in blocks:
        assert block.kind != "illustration" or len(block.why) > 20, block


def test_an_unmarked_block_is_refused():
    with pytest.raises(ValueError, match="1 fenced blocks, 0 of them marked"):
        guide_blocks("# page\n\n```bash\ndrape run --config x\n```\n")


def test_every_drape_command_in_the_guide_parses_with_the_real_cli():
    commands = [argv for block in guide_blocks() for argv in drape_commands(block.code)]
    heads = {argv[0] if argv[0] in ("run", "eval") else " ".join(argv[:2]) for argv in commands}
    steps = {"data shard", "data encode", "model describe", "queue sbatch", "queue render", "data prestage", "gate calibrate"}
    assert steps | {"run", "eval"} <= heads, heads
    for argv in commands:
        parses(argv)


@pytest.mark.parametrize(
    "argv",
    [["data", "shard", "x", "--out", "y", "--nmae", "z"], ["gate", "calbrate"], ["eval", "--config", "c"], ["run"]],
)
def test_the_guard_refuses_what_the_cli_refuses(argv):
    with pytest.raises(UsageError):
        parses(argv)
