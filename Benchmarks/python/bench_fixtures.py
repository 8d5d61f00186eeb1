"""The fleet bench's generated models: nets of Tests/python/coreml_fixtures.py written with coremltools into
the session folder at run time (coremltools is in the venv the driver runs in)."""
import subprocess
import sys
from pathlib import Path

from bench_common import ROOT

FIXTURES = ROOT / "Tests/python"


def bench_mlp(work, inputs=784, hidden=128):
    """The benchmark MLP inputs-hidden-10 (coreml_fixtures.bench_mlp: random weights, SGD lr 0.01 momentum 0.9,
    mini-batch 32 by default, input "pixels", label "digit" "0".."9"), written into `work`/fixtures; its path."""
    out = Path(work) / "fixtures"
    out.mkdir(parents=True, exist_ok=True)
    # Its own process: coremltools is slow to import and its builder announces every layer on stdout.
    code = (f"import sys; sys.path.insert(0, {str(FIXTURES)!r}); import coreml_fixtures; "
            f"coreml_fixtures.bench_mlp(sys.argv[1], {int(inputs)}, {int(hidden)})")
    done = subprocess.run([sys.executable, "-c", code, str(out)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    path = out / f"mlp-{inputs}-{hidden}-10.mlmodel"
    if done.returncode != 0 or not path.exists():
        raise RuntimeError(f"coreml_fixtures.bench_mlp failed: {done.stderr.strip()[-2000:]}")
    return path
