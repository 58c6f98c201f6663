#!/bin/sh
# TAP test of secret handling (SHOAL_UID, SHOAL_SECRET): shoal_info -c redacts them; a rank
# started by shoalrun, or through SHOAL_ROOT + SHOAL_SECRET, no longer has them in its
# environment or /proc/self/environ after shoal_comm_init_env, its children do not inherit
# them, and a TRACE log of every subsystem across init + allreduce + destroy never shows them.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
SHOALRUN="$top_builddir/shoalrun"
INFO="$top_builddir/shoal_info"
RANK="$top_builddir/tests/secrets/secret_rank"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_secrets.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
unset SHOAL_UID SHOAL_ROOT SHOAL_SECRET SHOAL_RANK SHOAL_NRANKS SHOAL_LOCAL_RANK \
    SHOAL_LOCAL_SIZE SHOAL_CONF_FILE SHOAL_DEBUG SHOAL_DEBUG_SUBSYS SHOAL_DEBUG_FILE

NTESTS=19
echo "1..$NTESTS"
n=0
ok() { # ok COND-EXIT-STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}
diag_file() { sed 's/^/#   /' "$1" | head -n 30; }

if [ ! -x "$SHOALRUN" ] || [ ! -x "$INFO" ] || [ ! -x "$RANK" ]; then
    i=0; while [ $i -lt $NTESTS ]; do i=$((i + 1)); echo "ok $i # SKIP not built in $top_builddir"; done
    exit 0
fi

SECRET=5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e7a11a
FSECRET=f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11eb0b0
UID_HEX=$(printf '0123456789abcdef%.0s' 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)

# leaks FILE VALUE...: 0 if FILE shows a value or a 20-character piece of one (pieces made
# only of zeros, the padding of a unique id, are not counted).
leaks() {
    f=$1; shift
    awk -v vals="$*" 'BEGIN { nv = split(vals, v, " ") }
        { for (k = 1; k <= nv; k++) for (i = 1; i + 19 <= length(v[k]); i++) {
              w = substr(v[k], i, 20); if (w ~ /^0+$/) continue
              if (index($0, w) > 0) { print FILENAME ": " $0; found = 1; exit } } }
        END { exit found ? 0 : 1 }' "$f" >>"$T/leaks"
}
# env_clean FILE...: no SHOAL_UID / SHOAL_SECRET variable in any of these env dumps
env_clean() {
    for f in "$@"; do
        [ -s "$f" ] || return 1
        grep -q '^SHOAL_UID=\|^SHOAL_SECRET=' "$f" && return 1
    done
    return 0
}

# 1-3: shoal_info -c prints neither value, whether from the environment or the conf file
SHOAL_SECRET=$SECRET SHOAL_UID=$UID_HEX "$INFO" -c >"$T/info" 2>&1
rc=$?
[ $rc -eq 0 ] && ! grep -q "$SECRET\|$UID_HEX\|5ec2e7\|0123456789abcdef" "$T/info"
ok $? "shoal_info -c does not print SHOAL_SECRET or SHOAL_UID (rc $rc)"
# secrets and defaults are comments (f32012c: the output is a loadable conf file)
grep -qx '# SHOAL_SECRET=<set>' "$T/info" && grep -qx '# SHOAL_UID=<set>' "$T/info" &&
    grep -qx '# SHOAL_ROOT=' "$T/info"
ok $? "shoal_info -c says <set> for them (other rows as before)"
printf 'SHOAL_SECRET=%s\n' "$FSECRET" >"$T/conf"
SHOAL_CONF_FILE="$T/conf" SHOAL_DEBUG=TRACE SHOAL_DEBUG_SUBSYS=ALL "$INFO" -c >"$T/info2" 2>&1
[ $? -eq 0 ] && ! grep -q "f11e5ec2" "$T/info2" && grep -qx '# SHOAL_SECRET=<set>' "$T/info2" &&
    grep -q 'set by: file' "$T/info2"
ok $? "shoal_info -c does not print a secret from SHOAL_CONF_FILE (TRACE log included)"

# check_job DIR NRANKS WHAT RC: the exit status, the per-rank reports, the children's
# environments and the logs
check_job() {
    d=$1; nr=$2; what=$3
    bad=$4; r=0
    while [ $r -lt "$nr" ]; do
        [ -s "$d/rank.$r" ] && grep -qx 'allreduce=ok' "$d/rank.$r" || bad=1
        r=$((r + 1))
    done
    ok $bad "$what: $nr ranks joined, reduced and exited 0"
    bad=0; r=0
    while [ $r -lt "$nr" ]; do
        grep -qx 'getenv_uid=0' "$d/rank.$r" && grep -qx 'getenv_secret=0' "$d/rank.$r" &&
            grep -qx 'procenv_uid=0' "$d/rank.$r" && grep -qx 'procenv_secret=0' "$d/rank.$r" ||
            { bad=1; diag_file "$d/rank.$r"; }
        r=$((r + 1))
    done
    ok $bad "$what: after init the rank's environment and /proc/self/environ hold neither"
    env_clean "$d"/child.*.env "$d"/exec.*.env && [ "$(ls "$d"/child.*.env | wc -l)" -eq "$nr" ]
    ok $? "$what: a child started with system() or fork + exec inherits neither"
    vals=$(cat "$d"/values.* | sort -u | tr '\n' ' ')
    : >"$T/leaks"
    nlog=0; leaked=0
    for f in "$d"/log.*; do
        [ -s "$f" ] || continue
        nlog=$((nlog + 1))
        leaks "$f" $vals && leaked=1
    done
    [ -n "$vals" ] && [ $nlog -ge "$nr" ] && [ $leaked -eq 0 ] &&
        grep -q ' TRACE ' "$d"/log.* && grep -q '\[BOOT\]' "$d"/log.*
    rc=$?
    [ $rc -ne 0 ] && diag_file "$T/leaks"
    ok $rc "$what: TRACE logs of every subsystem ($nlog files) show no piece of the secrets"
}

# 4-7: ranks started by shoalrun (SHOAL_UID)
mkdir "$T/run"
timeout -s KILL 120 env SHOAL_DEBUG=TRACE SHOAL_DEBUG_SUBSYS=ALL \
    SHOAL_DEBUG_FILE="$T/run/log.%p" "$SHOALRUN" -n 3 --timeout 60 "$RANK" "$T/run" \
    >"$T/out" 2>"$T/err"
rc=$?
[ $rc -ne 0 ] && diag_file "$T/err"
grep -qx 'had_uid=1' "$T/run/rank.0" 2>/dev/null || echo "# rank 0 was not handed SHOAL_UID"
check_job "$T/run" 3 "shoalrun" $rc

# 8-11: ranks started with SHOAL_ROOT + SHOAL_SECRET
mkdir "$T/root"
port=$((20000 + $$ % 20000))
pids=""
for r in 0 1 2; do
    timeout -s KILL 120 env SHOAL_RANK=$r SHOAL_NRANKS=3 SHOAL_ROOT=127.0.0.1:$port \
        SHOAL_SECRET=$SECRET SHOAL_TIMEOUT_MS=30s SHOAL_DEBUG=TRACE SHOAL_DEBUG_SUBSYS=ALL \
        SHOAL_DEBUG_FILE="$T/root/log.%p" "$RANK" "$T/root" >"$T/root.out.$r" 2>&1 &
    pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
[ $rc -ne 0 ] && diag_file "$T/root.out.0"
grep -qx 'had_secret=1' "$T/root/rank.0" 2>/dev/null || echo "# rank 0 was not handed SHOAL_SECRET"
check_job "$T/root" 3 "SHOAL_ROOT" $rc
grep -q "$SECRET" "$T"/root.out.*
[ $? -ne 0 ]
ok $? "SHOAL_ROOT: nothing the ranks print shows the secret"

# 13-14: a malformed secret is refused without being echoed (log and stderr)
mkdir "$T/bad"
BAD=zz5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e7a1
timeout -s KILL 60 env SHOAL_RANK=1 SHOAL_NRANKS=2 SHOAL_ROOT=127.0.0.1:$port \
    SHOAL_SECRET=$BAD SHOAL_DEBUG=TRACE SHOAL_DEBUG_SUBSYS=ALL "$RANK" "$T/bad" >"$T/bad.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q 'SHOAL_ROOT needs SHOAL_SECRET' "$T/bad.out"
ok $? "a malformed SHOAL_SECRET is refused (rc $rc)"
! grep -q "5ec2e7" "$T/bad.out"
ok $? "the refusal does not echo the malformed secret"

# 15-17: shoal_info -c under shoalrun's ranks: the uid is gone from a library user's output,
# and shoalrun's own ranks still get SHOAL_UID (the launcher is unchanged for non-shoal ranks)
timeout -s KILL 60 "$SHOALRUN" -n 2 --timeout 30 sh -c 'echo "uid=$SHOAL_UID"' >"$T/sh.out" 2>&1
[ "$(grep -c 'uid=[0-9a-f]\{256\}' "$T/sh.out")" -eq 2 ]
ok $? "ranks that are not shoal programs still see SHOAL_UID (a shell)"
timeout -s KILL 60 "$SHOALRUN" -n 2 --timeout 30 "$INFO" -c >"$T/sr.out" 2>&1
[ "$(grep -c 'SHOAL_UID=<set>' "$T/sr.out")" -eq 2 ] && ! grep -q 'SHOAL_UID=[0-9a-f]' "$T/sr.out"
ok $? "shoal_info -c run as shoalrun's ranks prints SHOAL_UID=<set>"
timeout -s KILL 60 "$SHOALRUN" -n 2 --timeout 30 "$INFO" -c -m >"$T/md.out" 2>&1
! grep -q '[0-9a-f]\{64\}' "$T/md.out"
ok $? "shoal_info -c -m prints no secret either"

# 18-19: shoalrun passes on the secrets the user gave it (the library it links removes them
# from shoalrun's own environment), with and without -x
timeout -s KILL 60 env SHOAL_SECRET=$SECRET "$SHOALRUN" -n 2 --timeout 30 \
    sh -c 'echo "s=$SHOAL_SECRET"' >"$T/pass.out" 2>&1
[ "$(grep -c "^.*s=$SECRET\$" "$T/pass.out")" -eq 2 ]
ok $? "shoalrun hands its ranks the SHOAL_SECRET of its environment"
timeout -s KILL 60 env SHOAL_SECRET=$SECRET "$SHOALRUN" -n 2 --timeout 30 -x SHOAL_SECRET \
    sh -c 'echo "s=$SHOAL_SECRET"' >"$T/pass2.out" 2>&1
[ "$(grep -c "^.*s=$SECRET\$" "$T/pass2.out")" -eq 2 ]
ok $? "shoalrun -x SHOAL_SECRET hands its ranks the current value"
