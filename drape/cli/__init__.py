"""The `drape` command: the composition root (it alone in drape/ may reach the flows and the queue).

Every command and option: `drape --help`, or docs/reference/cli.md, generated from this app when the
documentation site is built (docs/hooks.py), so no list here can fall behind it.

`drape --site FILE <command>` (or DRAPE_SITE) names the site file production configs take their
site values from (drape/config/reading/site.py).

One module per command group (`pipeline`, `data`, `gate`, `storage`, `queue`, `model`, `inference`,
`shopper`, `cost`); `common` holds the
console and config loading, `render` the report tables, `stack` the local Prefect stack.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from drape.cli import cost, data, gate, inference, model, pipeline, queue, shopper, storage
from drape.cli import eval as evaluation
from drape.cli.common import Typer
from drape.config import SITE_ENV
from drape.ops.logsink import tolerate_full_disks
from drape.ops.process import end_without_collection, stop_children_on_termination

app = Typer(help="drape: staged, gated, storage-aware training of try-on diffusion models.", no_args_is_help=True)


@app.callback()
def site_option(
    site: Path | None = typer.Option(
        None,
        "--site",
        envvar=SITE_ENV,
        help=f"your site file (a copy of configs/site.example.yaml): the paths, endpoints and names the production "
        f"configs take; default ${SITE_ENV}. Set for the command and every process it starts (flows, stage jobs)",
    ),
) -> None:
    """drape: staged, gated, storage-aware training of try-on diffusion models."""
    if site is not None:
        os.environ[SITE_ENV] = str(site)  # flows load their config in this process or a child: both read it


for command in (pipeline.demo, pipeline.run, pipeline.serve, pipeline.train):
    app.command()(command)
app.command()(inference.tryon)
app.command("eval")(evaluation.evaluate)
app.add_typer(data.app, name="data")
app.add_typer(gate.app, name="gate")
app.add_typer(storage.app, name="storage")
app.add_typer(queue.app, name="queue")
app.add_typer(model.app, name="model")
app.add_typer(inference.bench_app, name="bench")
app.add_typer(shopper.app, name="shopper")
app.add_typer(cost.app, name="cost")


def main() -> None:
    """The `drape` console command."""
    end_without_collection()
    tolerate_full_disks()  # `drape queue dispatch` or `drape run` logging to a full disk goes on (drape/ops/logsink.py)
    stop_children_on_termination()  # a service manager's SIGTERM stops children as Ctrl-C does
    sys.exit(app())
