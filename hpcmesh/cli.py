"""The ``hpcmesh`` command.

    hpcmesh apply mypkg.jobs.trainers     # apply a job spec, cache it in the current context
    hpcmesh status                         # kind, active?, meshes (+ squeue state for Slurm)
    hpcmesh exec -- hostname               # run on every host of the current job
    hpcmesh kill                           # kill the current job, drop its cache
    hpcmesh render configs/job.yaml        # the sbatch script a job spec gives
    hpcmesh info                           # this host / allocation / GPUs / interfaces
    hpcmesh worker --attach tcp://...      # a host agent (what launch scripts start)

Errors are one line on stderr; exit status 2 for usage errors (bad arguments,
a bad spec file, a missing secret), 1 for failures. ``HPCMESH_DEBUG=1`` shows
tracebacks. The current context is ``$HPCMESH_CONTEXT`` (default ``default``)
under ``$HPCMESH_STATE_DIR`` (default ``.hpcmesh``), or ``--context``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any, Sequence

from .errors import HpcmeshError
from .runtime.observe import nvidia_smi
from .runtime.process.gpu_binding import BINDINGS

PROG = "hpcmesh"


class UsageError(HpcmeshError):
    """Bad input from the user: exit status 2."""


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def _version() -> str:
    try:
        from importlib.metadata import version
        return version("hpcmesh")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        return "unknown"


def _err(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    name = type(exc).__name__
    generic = ("Exception", "RuntimeError", "ValueError", "UsageError", "SpecError")
    return first if name in generic or first.startswith(name) else f"{name}: {first}"


def _use_cwd_for_imports() -> None:
    """``hpcmesh apply mod.attr`` finds modules in the current directory, like ``python -m``,
    but after the standard library and installed packages, and only files nobody else can
    have planted or changed (another user's ``sysconfig.py`` in /tmp must not run as us)."""
    from .private_files.modules import import_from_folder
    import_from_folder(os.getcwd())


def _set_context(args) -> None:
    if getattr(args, "context", None):
        os.environ["HPCMESH_CONTEXT"] = args.context


def _cached_job():
    """The cached job of the current context, or None."""
    from .job.base import context_state_path, current_context, job_load
    _use_cwd_for_imports()      # the cache may name classes of the job spec's module
    path = context_state_path()
    try:
        return job_load(path), path
    except FileNotFoundError:
        return None, path
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"cannot read the job state {path} of context "
                           f"{current_context()!r}: {e}") from e


def _inner(job):
    """BatchJob wraps the job that holds the meshes."""
    from .job.local import BatchJob
    while isinstance(job, BatchJob):
        job = job.job
    return job


def _squeue_lines(job_ids: list[str]) -> list[str]:
    """One line per Slurm job for `hpcmesh status` (what squeue says of it)."""
    from .job.slurmctl import SlurmError, squeue_jobs
    try:
        recs = squeue_jobs(job_ids, timeout=30)
    except SlurmError as e:
        return [f"slurm job {', '.join(job_ids)}: {e}"]
    out = []
    for jid in job_ids:
        rec = recs.get(jid)
        if rec is None:
            out.append(f"slurm job {jid}: not in squeue (finished and purged)")
            continue
        where = f" on {','.join(rec.nodes)}" if rec.nodes else ""
        reason = f" ({rec.reason})" if rec.reason and rec.reason not in ("None", "(null)") else ""
        out.append(f"slurm job {jid}: {rec.state}{reason}{where}, time {rec.time_used}"
                   f"/{rec.time_limit}, partition {rec.partition}")
    return out


def _parse_kv(items: Sequence[str], what: str, as_int: bool = False) -> dict:
    out: dict[str, Any] = {}
    for item in items or ():
        for part in item.split(","):
            if not part:
                continue
            k, sep, v = part.partition("=")
            if not sep or not k:
                raise UsageError(f"{what} must look like NAME=VALUE, got {part!r}")
            if as_int:
                try:
                    out[k] = int(v)
                except ValueError:
                    raise UsageError(f"{what} {k}: {v!r} is not an integer") from None
            else:
                out[k] = v
    return out


# ---------------------------------------------------------------------------------------
# apply / status / kill / exec
# ---------------------------------------------------------------------------------------
def cmd_apply(args) -> int:
    from .job.base import activate_context, current_context, load_current_job, set_current_job
    _use_cwd_for_imports()
    try:
        set_current_job(args.spec)
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        raise UsageError(str(e)) from e
    job = load_current_job()
    link = activate_context()
    state = job.state(cached_path=link)
    inner = _inner(job)
    print(f"applied {args.spec} ({type(inner).__name__}) in context {current_context()!r}; "
          f"apply id {job.apply_id or inner.apply_id}")
    for jid in job.slurm_job_ids():
        print(f"  slurm job {jid}")
    for name in state.names():
        print(f"  {name}: {getattr(state, name)!r}")
    return 0


def cmd_status(args) -> int:
    from .job.base import current_context, current_job_ref
    job, path = _cached_job()
    ref = current_job_ref()
    if job is None:
        if ref:
            print(f"context {current_context()!r}: job spec {ref}, not applied "
                  f"(no state at {path}); run `hpcmesh apply {ref}`")
        else:
            print(f"context {current_context()!r}: no job; run `hpcmesh apply module.attr`")
        return 1
    inner = _inner(job)
    active = job.active
    print(f"context:  {current_context()}")
    print(f"spec:     {ref or '?'}")
    print(f"kind:     {type(inner).__name__}" +
          (" (in BatchJob)" if inner is not job else ""))
    print(f"active:   {'yes' if active else 'no'}")
    print(f"apply id: {job.apply_id or getattr(inner, 'apply_id', None) or '-'}")
    meshes = job.describe_meshes()
    if meshes:
        print("meshes:")
        for name, text in meshes.items():
            print(f"  {name}: {text}")
    ids = job.slurm_job_ids()
    if ids:
        for line in _squeue_lines(ids):
            print(line)
    return 0 if active else 3


def cmd_kill(args) -> int:
    from .job.base import current_context, remove_cache
    job, path = _cached_job()
    if job is None:
        _err(f"context {current_context()!r} has no applied job (no {path}); nothing to kill")
        return 1
    was_active = job.active
    job.kill()
    remove_cache(path)
    print(f"killed {type(_inner(job)).__name__} (apply id {job.apply_id or '-'})"
          + ("" if was_active else "; it was not active"))
    return 0


def cmd_exec(args) -> int:
    from .job.base import activate_context, load_current_job
    from .job.exec import exec_command
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("exec needs a command after --, e.g. `hpcmesh exec -- hostname`")
    # one argument is a shell line (as with ssh), unless --no-shell: then argv, as srun runs it
    cmd: str | list[str] = command[0] if len(command) == 1 and not args.no_shell else command
    env = _parse_kv(args.env, "--env")
    per_host = _parse_kv(args.per_host, "--per-host", as_int=True) or None
    point = _parse_kv(args.point, "--point", as_int=True) or None
    _use_cwd_for_imports()
    cached, _path = _cached_job()
    if cached is not None and cached.active:
        # the job that is running now (it may have been applied by a script, not `apply`)
        state = cached.running_state()
    else:
        try:
            job = load_current_job()
        except LookupError as e:
            raise UsageError(str(e)) from None
        state = job.state(cached_path=activate_context())
    names = state.names()
    if args.mesh:
        if args.mesh not in names:
            raise UsageError(f"the current job has no mesh {args.mesh!r}; its meshes: "
                             f"{', '.join(names)}")
        names = [args.mesh]
    multi = len(names) > 1

    def make_printer(mesh: str):
        def out(label: str, stream: str, line: str) -> None:
            prefix = f"[{mesh} {label}]" if multi else f"[{label}]"
            f = sys.stdout if stream == "stdout" else sys.stderr
            f.write(f"{prefix} {line}\n")
            f.flush()
        return out

    futures = []
    for name in names:
        try:
            futures.append(exec_command(getattr(state, name), cmd, env=env or None,
                                        workdir=args.workdir, output_dir=args.output_dir,
                                        rank=args.rank, point=point, per_host=per_host,
                                        gpu_binding=args.gpu_binding,
                                        on_output=None if args.output_dir
                                        else make_printer(name)))
        except (KeyError, IndexError, ValueError, TypeError) as e:   # --rank/--point/--per-host
            raise UsageError(f"exec on mesh {name!r}: {e.args[0] if e.args else e}") from None
    codes = [f.get(timeout=args.timeout) for f in futures]
    code = max(codes, default=0)
    return min(code, 255)


# ---------------------------------------------------------------------------------------
# render
# ---------------------------------------------------------------------------------------
def cmd_render(args) -> int:
    from .slurm import SpecError, load_job_spec, render_sbatch
    try:
        spec = load_job_spec(args.spec)
    except SpecError as e:
        raise UsageError(str(e)) from None
    attach = [a for item in (args.attach or ()) for a in item.split(",") if a]
    worker = None
    if not args.cli_worker:
        try:   # what SlurmJob submits (its agent adds ready files and time-limit notices)
            from .job.slurm_agent import agent_command
            worker = agent_command("{python}", attach=attach, mesh="{mesh}")
        except ImportError:
            worker = None
    if worker is None:
        from .private_files.modules import python_module
        worker = python_module("hpcmesh", "{python}") + ["worker"]
        if attach:
            worker += ["--attach", ",".join(attach)]
    env = _parse_kv(args.env, "--env") or None
    groups = spec.allocation_groups()
    if args.mesh:
        if args.mesh not in spec.meshes:
            raise UsageError(f"{args.spec}: no mesh {args.mesh!r}; the spec has "
                             f"{', '.join(spec.meshes)}")
        # with same_allocation the mesh shares the one script with the others
        groups = [g for g in groups if args.mesh in g]
    scripts = []
    for g in groups:
        try:
            scripts.append((g, render_sbatch(spec, worker, env, meshes=g,
                                             client_command=args.client)))
        except (SpecError, ValueError) as e:
            raise UsageError(f"{args.spec}: {e}") from None
    for i, (g, text) in enumerate(scripts):
        if len(scripts) > 1:
            print(f"# ===== sbatch script {i + 1} of {len(scripts)} (meshes: {', '.join(g)}) "
                  f"=====")
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


# ---------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------
def _gpu_line(gpu: dict) -> str:
    """``0, NVIDIA H200, 143771 MiB``: one GPU as ``hpcmesh info`` shows it."""
    total = gpu["memory_total_bytes"]
    return f"{gpu['gpu']}, {gpu['name']}, " + ("?" if total is None else f"{total >> 20} MiB")


def _gpu_info() -> dict:
    info: dict[str, Any] = {}
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    info["CUDA_VISIBLE_DEVICES"] = cvd
    visible = [d for d in (cvd or "").split(",") if d.strip()] if cvd is not None else None
    info["visible"] = len(visible) if visible is not None else None
    info["nvidia_smi"] = None
    try:
        # a one-off look, so longer than telemetry's 2 s: a GPU without persistence mode
        # can take seconds to wake
        found = nvidia_smi.query_gpus(timeout=15)
    except nvidia_smi.NvidiaSmiError as e:
        info["nvidia_smi_error"] = str(e)
    else:
        if found is not None:
            info["nvidia_smi"] = [_gpu_line(g) for g in found]
    try:
        info["dev_nvidia"] = sorted(n for n in os.listdir("/dev")
                                    if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        info["dev_nvidia"] = []
    return info


def cmd_info(args) -> int:
    from .slurm import Allocation, SlurmParseError, compress_hostlist
    from .transport import netif
    rc = 0
    report: dict[str, Any] = {"hostname": socket.gethostname(), "fqdn": socket.getfqdn(),
                              "python": sys.executable, "hpcmesh": _version()}
    try:
        alloc = Allocation.from_env(os.environ)
        alloc_err = None
    except SlurmParseError as e:
        alloc, alloc_err = None, str(e)
    gpus = _gpu_info()
    ifs = netif.list_interfaces()
    try:
        cands = netif.rank_candidates(ifs)
        cand_err = None
    except netif.NoUsableInterfaceError as e:
        cands, cand_err = [], str(e)
        rc = 1
    chosen = cands[0] if cands else None

    n_gpus = None
    if alloc is not None and alloc.gpus_per_node:
        n_gpus = alloc.gpus_per_node
    elif gpus["visible"] is not None:
        n_gpus = gpus["visible"]
    elif gpus["nvidia_smi"]:
        n_gpus = len(gpus["nvidia_smi"])
    elif gpus["dev_nvidia"]:
        n_gpus = len(gpus["dev_nvidia"])
    extent = {"hosts": alloc.num_nodes if alloc else 1}
    if n_gpus:
        extent["gpus"] = n_gpus

    if args.json:
        report.update({
            "extent": extent,
            "slurm": None if alloc is None else {
                "job_id": alloc.job_id, "nodes": alloc.nodes, "num_nodes": alloc.num_nodes,
                "tasks_per_node": alloc.tasks_per_node, "gpus_per_node": alloc.gpus_per_node,
                "cpus_per_task": alloc.cpus_per_task, "partition": alloc.partition,
                "node_name": alloc.node_name, "step_id": alloc.step_id},
            "slurm_error": alloc_err,
            "gpus": gpus,
            "interfaces": [{"name": i.name, "kind": i.kind, "state": i.operstate,
                            "addresses": list(i.addresses)} for i in ifs],
            "candidates": [{"ifname": c.ifname, "address": c.address, "rank": c.rank,
                            "reason": c.reason} for c in cands],
            "interface_error": cand_err,
        })
        print(json.dumps(report, indent=2))
        return rc

    print(f"host:        {report['hostname']} ({report['fqdn']})")
    print(f"python:      {report['python']} (hpcmesh {report['hpcmesh']})")
    print(f"extent:      {extent}")
    if alloc_err:
        print(f"slurm:       SLURM_* variables are inconsistent: {alloc_err}")
    elif alloc is None:
        print("slurm:       not inside a Slurm allocation (no SLURM_JOB_ID)")
    else:
        tpn = ",".join(map(str, alloc.tasks_per_node)) or "?"
        print(f"slurm:       job {alloc.job_id}" +
              (f" step {alloc.step_id}" if alloc.step_id else "") +
              (f", partition {alloc.partition}" if alloc.partition else ""))
        print(f"  nodes:     {alloc.num_nodes} ({compress_hostlist(alloc.nodes)})" +
              (f", this is {alloc.node_name}" if alloc.node_name else ""))
        print(f"  tasks/node: {tpn}")
        print(f"  gpus/node: {alloc.gpus_per_node if alloc.gpus_per_node is not None else '-'}")
        if alloc.cpus_per_task:
            print(f"  cpus/task: {alloc.cpus_per_task}")
    cvd = gpus["CUDA_VISIBLE_DEVICES"]
    print(f"gpus:        CUDA_VISIBLE_DEVICES={cvd if cvd is not None else '(unset)'}")
    if gpus["nvidia_smi"] is not None:
        print(f"  nvidia-smi: {len(gpus['nvidia_smi'])} GPU(s)")
        for line in gpus["nvidia_smi"]:
            print(f"    {line}")
    elif gpus.get("nvidia_smi_error"):
        print(f"  nvidia-smi: failed: {gpus['nvidia_smi_error']}")
    else:
        print("  nvidia-smi: not found")
    if gpus["dev_nvidia"]:
        print(f"  /dev:      {', '.join(gpus['dev_nvidia'])}")
    print("interfaces:" + (f" (HPCMESH_IFNAME={os.environ[netif.ENV_IFNAME]})"
                           if os.environ.get(netif.ENV_IFNAME) else ""))
    for line in netif.describe(cands, ifs).splitlines():
        print(f"  {line}")
    if chosen is not None:
        print(f"chosen:      {chosen.ifname} {chosen.address} -- {chosen.reason}")
        extra = netif.socket_ifname_env(chosen, os.environ)
        if extra:
            print("  for NCCL/gloo: " + " ".join(f"{k}={v}" for k, v in sorted(extra.items())))
    else:
        print(f"chosen:      none: {cand_err}")
    return rc


# ---------------------------------------------------------------------------------------
# worker
# ---------------------------------------------------------------------------------------
def _secret_for_worker(args) -> bytes:
    from .transport.addresses import secret_from_env
    if args.secret_stdin:
        line = sys.stdin.readline().strip()
        if not line:
            raise UsageError("worker: --secret-stdin given but stdin had no secret line")
        try:
            secret = bytes.fromhex(line)
        except ValueError:
            raise UsageError("worker: the secret on stdin is not hex") from None
        if len(secret) < 16:
            raise UsageError("worker: the secret on stdin is shorter than 16 bytes")
        return secret
    try:
        secret = secret_from_env()
    except ValueError as e:
        raise UsageError(f"worker: bad job secret: {e}") from None
    except OSError as e:
        raise UsageError(f"worker: cannot read HPCMESH_SECRET_FILE: {e}") from None
    if secret is None:
        raise UsageError("worker: no job secret: set HPCMESH_SECRET (hex) or HPCMESH_SECRET_FILE "
                         "(a file of mode 0600 holding the hex secret), or pass --secret-stdin")
    return secret


def cmd_worker(args) -> int:
    """Check the arguments (usage errors exit 2), then run the agent: everything about
    signals and stopping is :mod:`hpcmesh.runtime.process.agent_main`'s."""
    from .runtime.process.agent_main import configure_logging, exit_status, run_agent
    configure_logging()
    secret = _secret_for_worker(args)
    listen = args.listen or ["tcp://0.0.0.0:0"]
    from .transport.addresses import parse_address, parse_bind_address
    for url in listen:
        try:
            parse_address(url)
            parse_bind_address(url)
        except ValueError as e:
            raise UsageError(f"worker: --listen: {e}") from None
    attach = [a.strip() for item in (args.attach or ()) for a in item.split(",") if a.strip()]
    for url in attach:
        try:
            parse_address(url)
        except ValueError as e:
            raise UsageError(f"worker: --attach: {e}") from None
    if args.grace is not None and args.grace < 0:
        raise UsageError("worker: --grace must be >= 0")
    from .transport import tls
    try:
        settings = tls.settings(args.ca)        # None: $HPCMESH_TLS_CA, as --help says
        if settings is not None:
            tls.server_context(settings)        # the agent listens: its certificate must load
    except tls.TLSConfigError as e:
        raise UsageError(f"worker: --ca/{tls.ENV_CA}: {e}") from None
    from .runtime.process.agent_serve import default_advertise_host
    advertise = args.advertise_host or default_advertise_host(listen)
    reason = run_agent(listen, attach, secret, grace=args.grace, initial_wait=args.initial_wait,
                       advertise_host=advertise, ready_file=args.ready_file, ca=args.ca)
    return exit_status(reason)


def _service_urls(args) -> tuple[str, str | None]:
    """(admin URL, telemetry URL or None) of the running job for ``hpcmesh debug``/``top``:
    from ``--url-file``, the environment, or the services file beside the context's job
    state (``admin/services.py``). Not from the command line: ``ps`` shows it to every
    user, and the admin URL's token opens a pdb prompt in the job's processes. One given
    there anyway is refused rather than used with a warning: by then it has been visible,
    and a habit (a script, the shell's history) would go on showing it."""
    from .admin.services import ServiceURLError, find_urls
    from .job.base import context_state_path
    if args.url:
        raise UsageError(f"hpcmesh {args.command} takes no URL on its command line: every "
                         f"user of this host sees command lines (ps), and the URL carries "
                         f"the job's token. Leave it out (the job's client wrote it beside "
                         f"the job state), or pass it with --url-file PATH (a file of mode "
                         f"0600), --url-file - (standard input) or $HPCMESH_ADMIN_URL")
    try:
        return find_urls(args.url_file, os.path.dirname(context_state_path()))
    except (ServiceURLError, OSError) as e:
        raise UsageError(str(e)) from None


def cmd_debug(args) -> int:
    from .admin.debug import AdminDebugClient, attach, describe, pick
    admin_url, _ = _service_urls(args)
    client = AdminDebugClient(admin_url)
    sessions = client.list()
    if args.list:
        for s in sessions:
            print(describe(s))
        if not sessions:
            print("no actor is paused at a breakpoint()")
        return 0
    try:
        session = pick(sessions, args.session)
    except LookupError as e:
        _err(str(e))
        return 1
    print(f"attached to {describe(session)}; c, q or detach continues the endpoint",
          flush=True)
    attach(session, client.send)
    return 0


def cmd_top(args) -> int:
    from .admin.top import build_app
    admin_url, telemetry_url = _service_urls(args)
    try:
        app = build_app(admin_url, telemetry_url, interval=args.interval)
    except ImportError as e:
        raise UsageError(f"hpcmesh top needs textual: pip install 'hpcmesh[top]' ({e})") from None
    app.run()
    return 0


# ---------------------------------------------------------------------------------------
# argument parsing
# ---------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """Usage errors: the usage line, then one ``hpcmesh: error`` line; exit 2."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _url_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", nargs="?", help=argparse.SUPPRESS)     # refused, with how instead
    p.add_argument("--url-file", metavar="PATH",
                   help="read the admin URL from PATH (your file, mode 0600: a URL line or "
                        "a services.json), or from standard input with -; default: "
                        "$HPCMESH_ADMIN_URL, else the context's services.json")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="hpcmesh: Slurm-native launcher and actor-mesh runtime.",
                epilog="Run `hpcmesh COMMAND --help` for a command's options.")
    p.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    ctx = argparse.ArgumentParser(add_help=False)
    ctx.add_argument("--context", help="job context to use (default: $HPCMESH_CONTEXT or "
                                       "'default')")

    a = sub.add_parser("apply", parents=[ctx], help="apply a job spec and cache it",
                       description="Make the job `module.attr` the current one of this context, "
                                   "apply it (create it unless a cached running job can serve "
                                   "it), and cache its state. `attr` may be a JobTrait or a "
                                   "function returning one. The module is looked up on "
                                   "PYTHONPATH and in the installed packages, then in the "
                                   "current directory: there only a file (or package folder) "
                                   "of yours or root's, in a folder nobody else can write "
                                   "(/tmp's sticky bit is fine).")
    a.add_argument("spec", metavar="module.attr", help="where the job spec lives, e.g. "
                                                         "myproject.jobs.trainers")
    a.set_defaults(fn=cmd_apply)

    s = sub.add_parser("status", parents=[ctx], help="show the current job",
                       description="Show the current job of this context: kind, whether it is "
                                   "active, its meshes, and for Slurm jobs the squeue state. "
                                   "Exit status 0 if active, 3 if not, 1 if there is no job.")
    s.set_defaults(fn=cmd_status)

    k = sub.add_parser("kill", parents=[ctx], help="kill the current job",
                       description="Kill the current job of this context (scancel for Slurm "
                                   "jobs) and remove its cached state.")
    k.set_defaults(fn=cmd_kill)

    e = sub.add_parser("exec", parents=[ctx], help="run a command on every host of the job",
                       description="Run a command on every host (or per-host process) of the "
                                   "current job, printing each line prefixed with its point, "
                                   "e.g. [hosts=1]. A single argument is a shell command line: "
                                   "each host runs it with `bash -c`, so $VARS, pipes, ';' and "
                                   "quotes are the shell's (as with ssh; unlike srun and "
                                   "mpiexec, which never use a shell). Several arguments are "
                                   "exec'd as an argv, with no shell; --no-shell does that for "
                                   "a single one too. The exit status is the largest one.",
                       usage="hpcmesh exec [options] -- COMMAND [ARG ...]")
    e.add_argument("--mesh", help="only this mesh (default: every mesh of the job)")
    e.add_argument("--rank", type=int, help="only this flat rank")
    e.add_argument("--point", action="append", metavar="DIM=I[,DIM=I]",
                   help="only this point (dims left out stay whole), e.g. hosts=1")
    e.add_argument("--per-host", action="append", metavar="DIM=N",
                   help="processes per host, e.g. gpus=4 (default: one per host)")
    e.add_argument("--gpu-binding", choices=BINDINGS,
                   help="host: every process sees the host's GPUs and LOCAL_RANK selects its "
                        "own (torchrun's way); process: each sees only its GPU, LOCAL_RANK=0 "
                        "(default: $HPCMESH_GPU_BINDING, else host)")
    e.add_argument("--env", action="append", metavar="NAME=VALUE", help="extra environment")
    e.add_argument("--workdir", help="working directory on the hosts")
    e.add_argument("--output-dir", help="write output to files there instead of printing "
                                        "($SUBDIR becomes e.g. hosts_0); a folder of yours "
                                        "others cannot write (made 0700 if missing), files "
                                        "0600, no symlink there followed")
    e.add_argument("--timeout", type=float, help="give up after this many seconds")
    e.add_argument("--no-shell", action="store_true",
                   help="exec a single-argument COMMAND as a program, as srun would, instead "
                        "of running it with `bash -c`")
    e.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    e.set_defaults(fn=cmd_exec)

    r = sub.add_parser("render", help="print the sbatch script a job spec gives",
                       description="Validate a YAML job spec and print the sbatch script it "
                                   "gives (as SlurmJob(spec=load_job_spec(...)) would submit "
                                   "it, without the per-apply job folder, secret file and "
                                   "client addresses). A bad spec exits 2 with file:line and "
                                   "the key.")
    r.add_argument("spec", metavar="spec.yaml", help="the job spec file")
    r.add_argument("--mesh", help="with same_allocation: false, only this mesh's script")
    r.add_argument("--attach", action="append", metavar="ADDR[,ADDR]",
                   help="client address(es) the workers dial back to")
    r.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="variables to export for every mesh")
    r.add_argument("--client", metavar="COMMAND",
                   help="also run this client command inside the allocation")
    r.add_argument("--cli-worker", action="store_true",
                   help="start agents with `hpcmesh worker` instead of SlurmJob's agent")
    r.set_defaults(fn=cmd_render)

    i = sub.add_parser("info", help="describe this host / allocation",
                       description="What this host looks like to hpcmesh: hostname, the Slurm "
                                   "allocation from SLURM_* (job id, nodes, tasks per node, "
                                   "GPUs), the GPUs it sees (CUDA_VISIBLE_DEVICES, nvidia-smi), "
                                   "and the network interface candidates with the chosen one "
                                   "and why. Set HPCMESH_IFNAME to see an explicit choice.")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(fn=cmd_info)

    t = sub.add_parser("top", parents=[ctx], help="watch a running job's processes live",
                       description="The admin view of a running job in the terminal: every "
                                   "process with its host, point, pid, status, calls per "
                                   "second (with telemetry) and actors, refreshed every "
                                   "second; s shows the selected process's stacks, q quits. "
                                   "The job's client must have called enable_admin(); the URL "
                                   "(it carries the job's token) comes from --url-file, "
                                   "$HPCMESH_ADMIN_URL, or what the client wrote beside the "
                                   "context's job state (services.json, mode 0600), never "
                                   "from the command line, which every user sees.")
    _url_options(t)
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    t.set_defaults(fn=cmd_top)

    d = sub.add_parser("debug", parents=[ctx], help="attach to an actor paused at breakpoint()",
                       description="List the actors of the running job that are paused at a "
                                   "breakpoint() in a sync endpoint, and attach a pdb prompt "
                                   "to one (the only one, or --session N). c, q, detach or "
                                   "end of input continues the endpoint; other actors keep "
                                   "running meanwhile. Goes through the job's admin view "
                                   "(enable_admin()); the URL is found as for `hpcmesh top`.")
    _url_options(d)
    d.add_argument("--session", type=int, help="the session to attach to")
    d.add_argument("--list", action="store_true", help="only list the sessions")
    d.set_defaults(fn=cmd_debug)

    w = sub.add_parser("worker", help="run a host agent (used by launch scripts)",
                       description="Run an hpcmesh host agent on this host. It listens on "
                                   "--listen and, with --attach, dials the client (addresses "
                                   "probed in order, the first that answers wins). The job "
                                   "secret comes from HPCMESH_SECRET (hex), HPCMESH_SECRET_FILE "
                                   "or --secret-stdin; HPCMESH_JOB_TOKEN tells the client which "
                                   "job the agent belongs to. The agent exits once no "
                                   "controller has been connected for --grace seconds, and on "
                                   "SIGTERM/SIGINT/SIGHUP (killing what it started); "
                                   "SIGUSR1/SIGUSR2 (Slurm's time-limit warning) are recorded "
                                   "in $HPCMESH_SLURM_NOTICE.")
    w.add_argument("--listen", action="append", metavar="URL",
                   help="address to listen on (default tcp://0.0.0.0:0; repeatable)")
    w.add_argument("--attach", action="append", metavar="ADDR[,ADDR...]",
                   help="client address(es) to dial back to, in order of preference")
    w.add_argument("--grace", type=float, metavar="S",
                   help="exit this long after the last controller left (default "
                        "$HPCMESH_LEASE_GRACE or 30)")
    w.add_argument("--initial-wait", type=float, metavar="S",
                   help="exit if no controller connects within S seconds (default: wait)")
    w.add_argument("--ready-file", metavar="PATH",
                   help="write the listen addresses there once listening")
    w.add_argument("--advertise-host", metavar="HOST",
                   help="address processes started here listen on and advertise (default: "
                        "the chosen interface, see `hpcmesh info`)")
    w.add_argument("--secret-stdin", action="store_true",
                   help="read the hex job secret from the first line of stdin")
    w.add_argument("--ca", metavar="PATH|trust_all_connections",
                   help="encrypt TCP connections with TLS: a CA bundle that certifies this "
                        "agent (HPCMESH_TLS_CERT/KEY, default hpcmesh.pem/.key beside it), "
                        "or trust_all_connections (encrypt, verify nothing); default "
                        "$HPCMESH_TLS_CA; the client must use the same ca=")
    w.set_defaults(fn=cmd_worker)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help(sys.stderr)
        return 2
    _set_context(args)
    try:
        return int(args.fn(args) or 0)
    except UsageError as e:
        _err(_one_line(e))
        return 2
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # noqa: BLE001
        if os.environ.get("HPCMESH_DEBUG"):
            raise
        _err(f"{args.command}: {_one_line(e)}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
