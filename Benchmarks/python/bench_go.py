"""--driver go: the paced runs' publishing and listening done by Benchmarks/go/paced-driver, a Go binary, instead
of this driver's pika Publisher and EventListener. On a 2-core machine the Python side's CPU per job is of the
order of the worker's own, taken from the same cores as the system under test; the Go driver's is a fraction of
it. The fleet's warm-up stays here; only the measured window is the Go driver's."""
import os
import shutil
import subprocess
from pathlib import Path

from bench_common import ROOT, log

SOURCE = ROOT / "Benchmarks/go/paced-driver"
AMQP091 = Path("/usr/share/gocode/src/github.com/rabbitmq/amqp091-go")


def go_available():
    return shutil.which("go") is not None and AMQP091.is_dir()


def resolve_driver(args):
    """Which driver the paced runs use (args.driver_used: "go" or "python"), the Go one built once per bench run
    into the work folder (Go's build cache under ~/.cache/attune makes that quick after the first time)."""
    if getattr(args, "driver_used", None):
        return args.driver_used
    args.driver_used, args.go_driver = "python", None
    if args.driver == "python":
        return args.driver_used
    if not go_available():
        if args.driver == "go":
            raise SystemExit("--driver go: needs `go` and Debian's golang-github-rabbitmq-amqp091-go-dev "
                             "(scripts/install-deps.sh)")
        log("paced runs: no Go toolchain or amqp091-go; using the Python driver")
        return args.driver_used
    binary = Path(args.work) / "paced-driver"
    built = subprocess.run([str(SOURCE / "build.sh"), str(binary)], capture_output=True, text=True)
    if built.returncode != 0:
        if args.driver == "go":
            raise SystemExit(f"--driver go: building {SOURCE} failed:\n{built.stderr}")
        log(f"paced runs: building the Go driver failed; using the Python driver:\n{built.stderr}")
        return args.driver_used
    args.driver_used, args.go_driver = "go", binary
    log(f"paced runs: the Go driver ({binary})")
    return args.driver_used


def go_paced(ctx, jobs, rate, target):
    """bench_measure.latency's `paced` for the Go driver: the jobs file is written before the clock starts; under
    it, the driver runs with this one's listener unbound. The driver's CPU (its rusage) is left in
    ctx.go_cpu_seconds; it also counts in this process's tree (a reaped child's time is in cutime)."""
    args = ctx.args
    stem = Path(args.work) / f"paced-{jobs[0][0]}"
    jobs_file, times_file = stem.with_suffix(".jobs"), stem.with_suffix(".times")
    with open(jobs_file, "wb") as out:
        for job_id, user, body in jobs:
            head = "\t".join((job_id, *target(args, user)))
            if head.count("\t") != 2 or b"\n" in body:
                raise ValueError(f"job {job_id}: a tab in its id or target, or a newline in its body (the jobs "
                                 "file's separators)")
            out.write(head.encode() + b"\t" + body + b"\n")
    profile = os.environ.get("ATTUNE_PACED_DRIVER_PROFILE")  # a folder: keep a CPU profile of each run there
    extra = ["-cpuprofile", str(Path(profile) / f"{stem.name}.pprof")] if profile else []

    def run():
        ctx.listener.listen(False)
        try:
            proc = subprocess.Popen([str(args.go_driver), "-jobs", str(jobs_file), "-out", str(times_file), "-rate",
                                     repr(float(rate)), "-amqp-url", args.amqp_url, "-stall-seconds", "30", *extra])
            # wait4 rather than Popen.wait: the child's own CPU, whatever else this process has reaped.
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            ctx.listener.listen(True)
        ctx.go_cpu_seconds = usage.ru_utime + usage.ru_stime
        if proc.returncode not in (0, 1) or not times_file.exists():
            raise RuntimeError(f"the Go paced driver exited {proc.returncode}; see its message above")
        sent, ended = {}, {}
        for line in times_file.read_text().splitlines():
            job_id, published, end = line.split()
            sent[job_id] = int(published) / 1e9
            if end != "-1":
                ended[job_id] = int(end) / 1e9
        if proc.returncode == 1:
            raise RuntimeError("publishing failed (nacked or unroutable jobs): see the Go driver's message above")
        return sent, ended, max(sent.values()) - min(sent.values())

    return run
