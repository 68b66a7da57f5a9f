# Shared by the scripts that run a pytest suite against live `hypermnf serve` processes
# (ci-python.sh, hostile-test.sh, ogc-test.sh, web-test.sh). Source it after `cd` to the repository
# root with ROOT=$PWD and a `fail` function defined.

# hypermnf_venv PIP-ARGS...: the project's virtualenv ($CI_VENV, default .venv), created if missing,
# with PIP-ARGS installed; sets VENV and PY.
hypermnf_venv() {
    VENV=${CI_VENV:-.venv}
    case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    PY=$VENV/bin/python
    "$PY" -m pip install --quiet --disable-pip-version-check "$@"
}

# hypermnf_binary: exports HYPERMNF_BIN, the binary under test: as given, else the newest of
# target/{release,debug}/hypermnf, else a debug build made now.
hypermnf_binary() {
    if [ -z "${HYPERMNF_BIN:-}" ]; then
        for candidate in $(ls -t target/release/hypermnf target/debug/hypermnf 2>/dev/null); do
            HYPERMNF_BIN=$ROOT/$candidate
            break
        done
    fi
    if [ -z "${HYPERMNF_BIN:-}" ]; then
        cargo build --locked --bin hypermnf
        HYPERMNF_BIN=$ROOT/target/debug/hypermnf
    fi
    [ -x "$HYPERMNF_BIN" ] || fail "no hypermnf binary at $HYPERMNF_BIN"
    export HYPERMNF_BIN
}
