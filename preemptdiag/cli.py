"""Command line: a thin typer layer over main(argv) -> int.

Exit codes (identical in every format): 0 nothing at or above --fail-on; 1 findings
at or above it; 2 usage or input error (one line on stderr); 3 internal error (a
short paste-ready bug block on stderr). Heavy modules are imported inside commands
so `--help` stays fast.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from preemptdiag import __version__
from preemptdiag.model.errors import DiagError

app = typer.Typer(
    name="preemptdiag",
    help="Diagnose KV-cache preemption, CUDA OOM and host OOM incidents in vLLM/SGLang logs.",
    epilog=(
        "Exit codes: 0 nothing at or above --fail-on; 1 findings at or above it; 2 usage or "
        "input error (also no evidence, or nothing in --since/--until, with --strict); "
        "3 internal error."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
sig_app = typer.Typer(help="List and test line signatures.", no_args_is_help=True)
app.add_typer(sig_app, name="signatures")

FORMATS = ("terminal", "markdown", "json", "sarif")


def _width() -> int:
    import shutil

    return max(80, min(shutil.get_terminal_size((100, 24)).columns, 160))


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"preemptdiag {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_cb, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """preemptdiag: which of preemption, CUDA OOM or host OOM hit you, and the one lever to pull."""


def _want_color(choice: str, stream: Any) -> bool:
    if choice == "always":
        return True
    if choice == "never":
        return False
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _emit(text: str | Iterable[str], output: Path | None) -> None:
    """Write the report (whole, or in the pieces render_chunks gives) to stdout or
    `output`, ending in one newline."""
    chunks = [text] if isinstance(text, str) else text
    if output is None:
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            raise DiagError("cannot write the report: stdout is closed (use -o FILE)")
        try:
            _write_all(chunks, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise DiagError(f"cannot write the report to stdout: {exc.strerror}") from None
        return
    try:
        with output.open("w", encoding="utf-8") as f:
            _write_all(chunks, f)
    except OSError as exc:
        raise DiagError(f"cannot write {output}: {exc.strerror}") from None


def _write_all(chunks: Iterable[str], out: TextIO) -> None:
    last = ""
    for piece in chunks:
        if piece:
            out.write(piece)
            last = piece
    if not last.endswith("\n"):
        out.write("\n")


FilesArg = Annotated[
    list[str],
    typer.Argument(
        help="Log files (plain, .gz, .bz2, .xz, .zst), Prometheus scrapes, or - for stdin."
    ),
]
WindowOpt = Annotated[str | None, typer.Option("--window", help="Window size, e.g. 60s, 5m.")]
FailOnOpt = Annotated[
    list[str] | None,
    typer.Option("--fail-on", help="Classes that make the exit code 1 (comma list; 'none')."),
]
SigOpt = Annotated[Path | None, typer.Option("--signatures", help="Extra signature directory.")]
YearOpt = Annotated[int | None, typer.Option("--year", help="Year for year-less vLLM stamps.")]
TzOpt = Annotated[
    str | None, typer.Option("--tz", help="Zone of stamps without one (default UTC).")
]
BootOpt = Annotated[
    str | None, typer.Option("--boot-time", help="Boot time for dmesg uptime stamps.")
]
_WHEN = (
    "ISO 8601 (2026-11-04T16:07:00Z), '2026-11-04 16:07' (UTC unless it names a zone), "
    "or a bare 16:07 "
    "(on the date in the log's span that holds it; refused when several do)"
)
SinceOpt = Annotated[
    str | None, typer.Option("--since", help=f"Ignore events before this time: {_WHEN}.")
]
UntilOpt = Annotated[
    str | None, typer.Option("--until", help=f"Ignore events at/after this time: {_WHEN}.")
]
JobsOpt = Annotated[
    int | None, typer.Option("--jobs", "-j", help="Worker processes (default: cores).")
]
MaxEventsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-events",
        help="Stop past this many signal events (default: what half the free memory holds; "
        "0: no limit).",
    ),
]
NoRedactOpt = Annotated[bool, typer.Option("--no-redact", help="Do not redact secrets/prompts.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 2 when no evidence is found.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Config file (default: search).")]
PromOpt = Annotated[
    str | None,
    typer.Option(
        "--prometheus",
        help="Prometheus-API store to read (http://prometheus:9090); auth from "
        "PREEMPTDIAG_PROMETHEUS_TOKEN(_FILE) or _USER/_PASSWORD(_FILE).",
    ),
]
SelectorOpt = Annotated[
    str, typer.Option("--selector", help="Label selector for the store, e.g. '{namespace=\"x\"}'.")
]
StepOpt = Annotated[
    str | None, typer.Option("--step", help="Query step (default: 15s, at most the window).")
]


FormatsOpt = Annotated[
    list[str] | None,
    typer.Option("--format", "-f", help="terminal|markdown|json|sarif (repeatable)."),
]
OutputsOpt = Annotated[
    list[Path] | None, typer.Option("--output", "-o", help="File for the matching --format.")
]
ColorOpt = Annotated[str, typer.Option("--color", help="auto|always|never")]


def _check_formats(fmt: list[str] | None, color: str) -> None:
    for f in fmt or []:
        if f not in FORMATS:
            raise DiagError(f"unknown --format {f!r} (choose from {', '.join(FORMATS)})")
    if color not in ("auto", "always", "never"):
        raise DiagError(f"--color must be auto, always or never, not {color!r}")


def _store(url: str | None, selector: str, step: str | None) -> Any:
    """--prometheus/--selector/--step as the pipeline's PromSource (None without a URL)."""
    from preemptdiag.ingest.prometheus_api import PromSource, check_selector
    from preemptdiag.model.config import parse_duration

    if url is None:
        if selector or step:
            raise DiagError("--selector and --step need --prometheus URL")
        return None
    step_s = parse_duration(step) if step else None
    return PromSource(url=url, selector=check_selector(selector), step_s=step_s)


@app.command()
def analyze(
    files: Annotated[
        list[str] | None,
        typer.Argument(
            help="Log files (plain, .gz, .bz2, .xz, .zst), Prometheus scrapes, or - for stdin."
        ),
    ] = None,
    fmt: FormatsOpt = None,
    output: OutputsOpt = None,
    window: WindowOpt = None,
    fail_on: FailOnOpt = None,
    signatures: SigOpt = None,
    color: ColorOpt = "auto",
    timeline: Annotated[
        str | None,
        typer.Option(
            "--timeline",
            help="full: every window; episodes: runs of one class collapsed, the verdict's "
            "windows in full (default: episodes for terminal/markdown, full for json).",
        ),
    ] = None,
    year: YearOpt = None,
    tz: TzOpt = None,
    boot_time: BootOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    jobs: JobsOpt = None,
    max_events: MaxEventsOpt = None,
    no_redact: NoRedactOpt = False,
    strict: StrictOpt = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the verdict line.")
    ] = False,
    config: ConfigOpt = None,
    prometheus: PromOpt = None,
    selector: SelectorOpt = "",
    step: StepOpt = None,
) -> None:
    """Classify each time window and recommend the ONE lever to change next."""
    from dataclasses import replace

    files = files or []
    if not files and prometheus is None:
        # A usage error, as click gives when an argument is missing: files are
        # optional to click only because --prometheus can stand alone.
        raise typer.BadParameter(
            "pass one or more logs, - for stdin, or --prometheus URL",
            param_hint="'FILES...'",
        )
    from preemptdiag.commands.analyze import run_analysis
    from preemptdiag.render import Format, render_chunks, timeline_mode
    from preemptdiag.render.summary import verdict_line

    _check_formats(fmt, color)
    mode = timeline_mode(timeline) if timeline is not None else None
    from preemptdiag.commands.options import build_options, plan_outputs

    plan = plan_outputs(fmt, list(output or []), files)

    opts = build_options(
        files,
        window,
        fail_on,
        signatures,
        year,
        tz,
        boot_time,
        since,
        until,
        jobs,
        no_redact,
        strict,
        config,
        max_events,
    )
    opts = replace(opts, prometheus=_store(prometheus, selector, step))
    from preemptdiag.render.progress import progress_factory

    outcome = run_analysis(opts, progress=progress_factory(not quiet))
    if quiet:
        _emit(verdict_line(outcome.report), None)
        raise typer.Exit(outcome.exit_code)
    for f, dest in plan:
        use_color = dest is None and _want_color(color, sys.stdout)
        chunks = render_chunks(
            outcome.report,
            Format(f),
            color=use_color,
            width=_width(),
            timeline=mode,
            processes=opts.jobs,
        )
        _emit(chunks, dest)
    _KEPT[:] = [outcome]  # freed by the process's exit, not object by object (run)
    raise typer.Exit(outcome.exit_code)


@app.command()
def fleet(
    prometheus: Annotated[
        str,
        typer.Option(
            "--prometheus",
            help="Prometheus-API store (http://prometheus:9090); auth from "
            "PREEMPTDIAG_PROMETHEUS_TOKEN(_FILE) or _USER/_PASSWORD(_FILE).",
        ),
    ],
    selector: SelectorOpt = "",
    step: StepOpt = None,
    since: Annotated[
        str, typer.Option("--since", help="Start: 1h (ago), or a time as analyze takes.")
    ] = "1h",
    until: Annotated[str | None, typer.Option("--until", help="End (default: now).")] = None,
    fmt: FormatsOpt = None,
    output: OutputsOpt = None,
    window: WindowOpt = None,
    fail_on: FailOnOpt = None,
    color: ColorOpt = "auto",
    tz: TzOpt = None,
    strict: StrictOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Every replica in a Prometheus store classified by analyze's rules, worst first."""
    from dataclasses import replace

    from preemptdiag.commands.fleet import run_fleet
    from preemptdiag.commands.options import build_options, plan_outputs
    from preemptdiag.render.fleet import render_fleet

    _check_formats(fmt, color)
    plan = plan_outputs(fmt, list(output or []), [])
    opts = build_options(
        [], window, fail_on, None, None, tz, None, since, until, 1, False, strict, config
    )
    outcome = run_fleet(replace(opts, prometheus=_store(prometheus, selector, step)))
    for f, dest in plan:
        use_color = dest is None and _want_color(color, sys.stdout)
        _emit(render_fleet(outcome.report, f, color=use_color), dest)
    raise typer.Exit(outcome.exit_code)


@app.command()
def alerts(
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="rules (a rules file) | k8s (PrometheusRule).")
    ] = "rules",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file.")
    ] = None,
    prometheus: Annotated[
        str,
        typer.Option("--prometheus", help="Store URL the annotations' analyze command reads."),
    ] = "http://prometheus:9090",
    selector: SelectorOpt = "",
    window: WindowOpt = None,
    name: Annotated[str, typer.Option("--name", help="PrometheusRule name (k8s).")] = "preemptdiag",
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="PrometheusRule namespace (k8s).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """The classification thresholds as Prometheus recording and alerting rules."""
    from preemptdiag.commands.alerts import AlertOptions, render_rules
    from preemptdiag.ingest.prometheus_api import shown_url
    from preemptdiag.model.config import load_config, parse_duration

    cfg = load_config(config)
    opts = AlertOptions(
        thresholds=cfg.thresholds,
        window_seconds=parse_duration(window or cfg.window or "60s"),
        selector=selector,
        # An annotation is read by everyone who sees the alert: never a credential.
        prometheus_url=shown_url(prometheus) or prometheus,
        fmt=fmt,
        name=name,
        namespace=namespace,
    )
    _emit(render_rules(opts), output)


@app.command()
def check(
    files: FilesArg,
    fail_on: FailOnOpt = None,
    window: WindowOpt = None,
    signatures: SigOpt = None,
    year: YearOpt = None,
    strict: StrictOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Pre-commit/CI mode: one verdict line per file, exit 1 if any incident fails.

    Files of one incident are judged together: an engine log with its rotated files,
    and the kernel/kubectl/docker files and /metrics scrapes of its folder (or of its
    time span); `a.log+b.prom` groups files by hand. Folders are walked for
    *.log, *.txt and *.prom (also compressed). An unreadable file is one error line
    (exit 2); the others are still judged."""
    from preemptdiag.commands.check import run_check
    from preemptdiag.commands.options import build_options

    opts = build_options(
        ["-"],
        window,
        fail_on,
        signatures,
        year,
        None,
        None,
        None,
        None,
        None,
        False,
        strict,
        config,
    )
    raise typer.Exit(run_check(files, opts, lambda line: _emit(_said(line), None)))


@app.command()
def explain(
    topic: Annotated[str, typer.Argument(help="A class (e.g. thrash_loop) or a signature id.")],
    signatures: SigOpt = None,
) -> None:
    """Runbook text for a class, or what a signature matches."""
    from preemptdiag.commands.explain import explain_topic

    _emit(explain_topic(topic, signatures), None)


@sig_app.command("list")
def signatures_list(signatures: SigOpt = None) -> None:
    """List every signature (id, kind, engine, versions)."""
    from preemptdiag.scan.signatures import load

    for s in load(signatures):
        _emit(f"{s.id:<44} {s.kind.value:<14} {s.engine:<7} {s.versions}", None)


@sig_app.command("test")
def signatures_test(
    directory: Annotated[Path | None, typer.Argument(help="Directory (default: built-in).")] = None,
) -> None:
    """Run every embedded example; report failures and undeclared overlaps."""
    from preemptdiag.scan.signatures import check_examples, load, load_dir, overlaps

    sigs = list(load_dir(directory)) if directory else list(load())
    universe = list(load(directory)) if directory else sigs
    bad = 0
    for s in sigs:
        for p in check_examples(s):
            _emit(f"FAIL {s.id}: {p}", None)
            bad += 1
    mine = {s.id for s in sigs}
    for a, b, line in overlaps(universe):
        if a in mine:
            _emit(f"OVERLAP {a} ~ {b}: {line[:100]}", None)
            bad += 1
    n_ex = sum(len(s.matches) + len(s.no_matches) for s in sigs)
    _emit(f"{len(sigs)} signatures, {n_ex} examples, {bad} problem(s)", None)
    raise typer.Exit(1 if bad else 0)


@app.command()
def compare(
    before: Annotated[str, typer.Argument(help="Before capture: file(s), comma-separated.")],
    after: Annotated[str, typer.Argument(help="After capture: file(s), comma-separated.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="terminal|markdown|json")] = "terminal",
    window: WindowOpt = None,
    year: YearOpt = None,
    signatures: SigOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Before/after a change: improved, not fixed, regressed, moved into queueing, or inconclusive."""
    from preemptdiag.commands.compare import compare as do_compare
    from preemptdiag.commands.compare import exit_code
    from preemptdiag.render.compare import render_compare

    if fmt not in ("terminal", "markdown", "json"):
        raise DiagError(f"unknown --format {fmt!r} for compare (terminal, markdown, json)")
    from preemptdiag.commands.options import build_options

    opts = build_options(
        [before], window, None, signatures, year, None, None, None, None, None, False, False, config
    )
    b = [p for p in before.split(",") if p]
    a = [p for p in after.split(",") if p]
    result = do_compare(b, a, opts)
    _emit(render_compare(result, fmt), None)
    raise typer.Exit(exit_code(result))


@app.command()
def budget(
    model: Annotated[str | None, typer.Option("--model", help="Model name from the table.")] = None,
    layers: Annotated[int | None, typer.Option("--layers")] = None,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads")] = None,
    head_dim: Annotated[int | None, typer.Option("--head-dim")] = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help="KV cache dtype: fp16, bf16, fp8...")
    ] = "auto",
    pool_gib: Annotated[float | None, typer.Option("--pool-gib", help="KV pool size, GiB.")] = None,
    prompt: Annotated[float | None, typer.Option("--prompt", help="Prompt tokens/request.")] = None,
    output: Annotated[float | None, typer.Option("--output", help="Output tokens/request.")] = None,
    prompt_p95: Annotated[float | None, typer.Option("--prompt-p95")] = None,
    output_p95: Annotated[float | None, typer.Option("--output-p95")] = None,
    headroom: Annotated[
        float, typer.Option("--headroom", help="Fraction of the pool to plan for.")
    ] = 0.9,
    from_log: Annotated[
        list[str] | None,
        typer.Option("--from-log", help="Take KV tokens from this log's start-up lines."),
    ] = None,
    tensor_parallel: Annotated[
        int,
        typer.Option(
            "--tensor-parallel", "--tp", help="Ranks; --pool-gib is then one rank's KV memory."
        ),
    ] = 1,
) -> None:
    """KV budget: bytes per token, max live tokens, sustainable concurrency, --max-num-seqs."""
    from preemptdiag.diagnose import budget as b

    if not 0 < headroom <= 1:
        raise DiagError("--headroom must be in (0, 1]")
    if tensor_parallel < 1:
        raise DiagError("--tensor-parallel must be at least 1")
    if from_log:
        from preemptdiag.commands.analyze import Options, run_analysis
        from preemptdiag.timeline.knobs import read_facts

        outcome = run_analysis(Options(files=tuple(from_log), jobs=1))
        facts = read_facts(outcome.events)
        if not facts.kv_tokens:
            raise DiagError(
                "no KV capacity line in the log (`GPU KV cache size: N tokens`, "
                "`# GPU blocks: N`, SGLang `max_total_num_tokens=N`)"
            )
        p = prompt_p95 if prompt_p95 is not None else prompt
        o = output_p95 if output_p95 is not None else output
        if p is None or o is None:
            raise DiagError("give --prompt and --output (or the -p95 forms) with --from-log")
        result = b.budget_from_tokens(
            facts.kv_tokens, p, o, headroom, source=facts.kv_tokens_how or "log start-up lines"
        )
    else:
        result = b.budget_main(
            b.BudgetArgs(
                model=model,
                layers=layers,
                kv_heads=kv_heads,
                head_dim=head_dim,
                dtype=dtype,
                pool_gib=pool_gib,
                prompt=prompt,
                output=output,
                prompt_p95=prompt_p95,
                output_p95=output_p95,
                headroom=headroom,
                tensor_parallel=tensor_parallel,
            )
        )
    _emit(b.format_budget(result), None)


INTERRUPTED = "preemptdiag: interrupted\n"


def _said(text: str) -> str:
    """An error message or bug block as it may be shown: a refusal can quote a log
    line (a scrape that does not parse, a value that does not convert), so prompt
    text, secrets and terminal control are taken out as in a report."""
    from preemptdiag.render.redact import redact
    from preemptdiag.render.sanitise import clean

    return clean(redact(text))


def _bug_block(exc: BaseException) -> str:
    tb = _said("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:]))
    return (
        "preemptdiag: internal error (exit 3). Please report this block:\n"
        f"```\npreemptdiag {__version__}, Python {sys.version.split()[0]}, {sys.platform}\n"
        f"{tb}```"
    )


# The last analysis, kept past its command: a month of one-minute windows is millions
# of objects, and freeing them one by one as the command returned, then the rest at
# interpreter exit, cost ~0.2 s of CPU after the report was written (measured).
_KEPT: list[object] = []


def _say(text: str) -> None:
    """Write to stderr, unless the shell closed it too (`2>&-`): the exit code is then
    all that is left to say."""
    if sys.stderr is not None:
        sys.stderr.write(text)


def main(argv: list[str] | None = None) -> int:
    # The exceptions of the click typer runs on (its own copy since typer 0.28).
    usage = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    click = importlib.import_module(usage.__module__)
    no_args = getattr(click, "NoArgsIsHelpError", ())
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # Not standalone: click's usage errors come here, to be said in one line.
        code = app(args=args, prog_name="preemptdiag", standalone_mode=False)
        code = code if isinstance(code, int) else 0
        if code == 130:  # typer's answer to Ctrl-C; no command exits 130 itself
            _say(INTERRUPTED)
        return code
    except SystemExit as exc:  # typer/click end some runs with one, carrying the code
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except no_args as exc:
        exc.show()  # the help text, as `preemptdiag` alone has always printed it
        return 2
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "preemptdiag"
        msg = _said(exc.format_message())
        _say(f"preemptdiag: error: {msg} (see {where} --help)\n")
        return int(exc.exit_code)
    except click.ClickException as exc:
        _say(f"preemptdiag: error: {_said(exc.format_message())}\n")
        return int(exc.exit_code)
    except DiagError as exc:
        _say(f"preemptdiag: error: {_said(exc.message)}\n")
        return exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        _say(INTERRUPTED)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the one place that turns bugs into exit 3
        if _cannot_write(exc):
            # click's help and version text, written before any report (_emit says its own)
            return 2
        _say(_bug_block(exc) + "\n")
        return 3


# What only writing gives (reading an input is said where it is opened): a full disk
# or quota under `> file`, a file past the size limit.
_CANNOT_WRITE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _cannot_write(exc: BaseException) -> bool:
    """Whether exc is output that could not be written; if so, it is said."""
    if not isinstance(exc, OSError) or exc.errno not in _CANNOT_WRITE:
        return False
    _say(f"preemptdiag: error: cannot write the output: {exc.strerror}\n")
    return True


# polars' allocator (jemalloc, read from this variable when polars first allocates)
# hands freed pages back to the OS after 10 s by default, longer than most runs: the
# buffers of a month of 1 MiB blocks stayed mapped (~25 MiB of a 30-day log's peak).
# At 50 ms the peak drops and the time does not move (0 ms cost ~0.5 s of madvise
# calls for ~8 MiB less). A value the user set is kept.
_POLARS_ALLOCATOR = ("_RJEM_MALLOC_CONF", "dirty_decay_ms:50,muzzy_decay_ms:0")


def run() -> None:
    """The console script: main, then an exit that leaves the memory to the OS (the
    report is written and flushed by then; nothing of ours registers exit hooks)."""
    os.environ.setdefault(*_POLARS_ALLOCATOR)  # before anything imports polars
    code = main()
    for stream in (sys.stdout, sys.stderr):
        # None when the shell closed the descriptor (`>&-`): main has said so already
        if stream is None:
            continue
        try:
            stream.flush()
        except OSError as exc:
            # Text still buffered did not get out: not a verdict to exit with. (A
            # reader that stopped early, `| head`, is not an error; nor is stderr.)
            if stream is sys.stdout and _cannot_write(exc):
                code = 2
        except ValueError:  # a stream already closed
            pass
    os._exit(code)
