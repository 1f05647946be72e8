#!/usr/bin/env bash
# Create the peer servers' virtual environments under benchmarks/.venvs/ (gitignored), one per peer,
# so their dependencies never touch the project's own environment:
#
#   benchmarks/.venvs/mosec     mosec==0.9.8 + numpy, scikit-learn, joblib
#   benchmarks/.venvs/mlserver  mlserver==1.7.1 + mlserver-sklearn==1.7.1 + uvloop==0.21.0
#
# Run once:   bash benchmarks/setup_peers.sh            (both)
#             bash benchmarks/setup_peers.sh mosec      (only one)
# PYTHON=/path/to/python3.11 picks the interpreter (default: python3.11, else python3).
# Re-running is safe: an existing venv is reused and pip only installs what is missing.
# Not part of CI: benchmarks/run.py skips a peer whose venv is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venvs="$here/.venvs"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(mosec mlserver)

# the scikit-learn and numpy pins only make the peers unpickle the same model file that the
# reference runtime serves; pick the versions installed in the project's environment when known
# (the repository's .venv, as `make up` creates it, or PROJECT_PYTHON=/path/to/python)
sk_pin="scikit-learn"
np_pin="numpy"
if [ -x "$here/../.venv/bin/python" ] || [ -n "${PROJECT_PYTHON:-}" ]; then
    proj="${PROJECT_PYTHON:-$here/../.venv/bin/python}"
    sk_pin="scikit-learn==$("$proj" -c 'import sklearn; print(sklearn.__version__)' 2>/dev/null)" || sk_pin="scikit-learn"
    np_pin="numpy==$("$proj" -c 'import numpy; print(numpy.__version__)' 2>/dev/null)" || np_pin="numpy"
fi

make_venv() {  # make_venv NAME PACKAGE...
    local name="$1"; shift
    local dir="$venvs/$name"
    if [ ! -x "$dir/bin/python" ]; then
        echo "setup_peers: creating $dir with $python"
        "$python" -m venv "$dir"
        "$dir/bin/python" -m pip install --quiet --upgrade pip
    fi
    echo "setup_peers: installing into $name: $*"
    "$dir/bin/python" -m pip install --quiet "$@"
    "$dir/bin/python" -m pip freeze > "$dir/freeze.txt"
}

for peer in "${peers[@]}"; do
    case "$peer" in
        mosec)
            # mosec needs the same scikit-learn as the model file's writer; fall back to any
            # version if that exact pin cannot be resolved for this interpreter
            make_venv mosec mosec==0.9.8 "$np_pin" "$sk_pin" joblib threadpoolctl \
                || make_venv mosec mosec==0.9.8 numpy scikit-learn joblib threadpoolctl ;;
        mlserver)
            # same scikit-learn as the project if mlserver-sklearn accepts it, else its own pick
            make_venv mlserver mlserver==1.7.1 mlserver-sklearn==1.7.1 uvloop==0.21.0 \
                "$np_pin" "$sk_pin" \
                || make_venv mlserver mlserver==1.7.1 mlserver-sklearn==1.7.1 uvloop==0.21.0 ;;
        *)
            echo "setup_peers: unknown peer $peer (known: mosec mlserver)" >&2; exit 2 ;;
    esac
done
echo "setup_peers: done; venvs in $venvs"
