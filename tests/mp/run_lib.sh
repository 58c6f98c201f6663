# shellcheck shell=sh
# Shared by tests/mp/run_mp.sh and tests/mp/run_algos.sh (sourced): one shoalrun job whose
# rank 0 prints TAP, merged into the caller's TAP stream.
#
#   mp_job LABEL NRANKS "VAR=VALUE..." PROGRAM [ARGS...]
#       runs PROGRAM on NRANKS ranks (SHOAL_TIMEOUT_MS=30000 and the variables go to every
#       rank with -x; SHOAL_TRANSPORT and SHOAL_ALGO are never inherited), prints rank 0's
#       results as "ok|not ok N - LABEL: ...", its stderr as comments when something failed,
#       and one more line for shoalrun's exit status.
# Needs: $shoalrun, $timeout (seconds per job), $tmp (a scratch directory), n_tap (the count).
# MP_WRAP: a command every rank runs PROGRAM through (tests/vm/rxe_host.sh: one RDMA device
# per virtual host).

mp_job() {
    _mp_label=$1
    _mp_n=$2
    _mp_xs=""
    for _mp_v in SHOAL_TIMEOUT_MS=30000 $3; do
        _mp_xs="$_mp_xs -x $_mp_v"
    done
    shift 3
    _mp_t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # the -x list is a word list on purpose
    env -u SHOAL_TRANSPORT -u SHOAL_ALGO "$shoalrun" --no-prefix --timeout "$timeout" \
        -n "$_mp_n" $_mp_xs ${MP_WRAP:-} "$@" >"$tmp/out" 2>"$tmp/err"
    _mp_rc=$?
    _mp_secs=$(awk -v a="$_mp_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    _mp_groups=0
    while IFS= read -r _mp_line; do
        case $_mp_line in
        "ok "*|"not ok "*)
            n_tap=$((n_tap + 1))
            _mp_groups=$((_mp_groups + 1))
            echo "${_mp_line%% [0-9]*} $n_tap - $_mp_label: ${_mp_line#* - }"
            ;;
        "Bail out!"*)
            n_tap=$((n_tap + 1))
            echo "not ok $n_tap - $_mp_label: rank 0 bailed out: ${_mp_line#Bail out!}"
            ;;
        "#"*)
            echo "$_mp_line"
            ;;
        esac
    done <"$tmp/out"
    # Diagnostics of failing cases (and the library's errors) into the log as comments.
    if [ "$_mp_rc" -ne 0 ] || grep -q '^# rank' "$tmp/err"; then
        sed -e 's/^/# stderr: /' "$tmp/err" | grep -v '^# stderr: $' | head -n 60
    fi
    n_tap=$((n_tap + 1))
    if [ "$_mp_rc" -eq 0 ] && [ "$_mp_groups" -gt 0 ]; then
        echo "ok $n_tap - $_mp_label: shoalrun exited 0 after ${_mp_secs} s ($_mp_groups groups)"
    elif [ "$_mp_rc" -eq 124 ]; then
        echo "not ok $n_tap - $_mp_label: timed out after ${_mp_secs} s" \
            "(shoalrun --timeout $timeout)"
    else
        # the first failed case on this line too: a CI summary that keeps only the "not ok"
        # lines still says what failed
        _mp_why=$(grep -m1 '^# rank' "$tmp/err" | cut -c3-240)
        echo "not ok $n_tap - $_mp_label: shoalrun exited $_mp_rc after ${_mp_secs} s" \
            "($_mp_groups groups)${_mp_why:+: $_mp_why}"
    fi
}
