#!/bin/sh
# TAP test of shoal-cred, the provider's credential tool: keygen (mode 0600, never overwrites),
# issue -> verify, tampered / wrong key / expired credentials rejected, per-tenant keys, key
# file checks, and that no output ever shows a key.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
CRED="$top_builddir/shoal-cred"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_shoal_cred.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
unset SHOAL_CREDENTIAL SHOAL_CREDENTIAL_FILE SHOAL_DEBUG SHOAL_DEBUG_FILE

NTESTS=46
echo "1..$NTESTS"
n=0
ok() { # ok COND-EXIT-STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else
        echo "not ok $n - $2"; sed 's/^/#   /' "$T/err" | head -n 10; fi
}
is() { # is GOT WANT DESCRIPTION
    n=$((n + 1))
    if [ "$1" = "$2" ]; then echo "ok $n - $3"; else
        echo "not ok $n - $3"; echo "#   got: '$1'"; echo "#  want: '$2'"; fi
}
# Runs shoal-cred under a deadline; stdout in $T/out, stderr in $T/err (both also appended to
# $T/all), status in $rc.
cred() {
    timeout -s KILL 30 "$CRED" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    cat "$T/out" "$T/err" >>"$T/all"
}
cred_in() { # cred_in INPUT ARGS...: the same with INPUT on stdin
    input=$1; shift
    printf '%s\n' "$input" | timeout -s KILL 30 "$CRED" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    cat "$T/out" "$T/err" >>"$T/all"
}

if [ ! -x "$CRED" ]; then
    i=0
    while [ $i -lt $NTESTS ]; do i=$((i + 1)); echo "ok $i # SKIP no shoal-cred in $top_builddir"; done
    exit 0
fi
: >"$T/all"

# 1-5: keygen writes 32 bytes with mode 0600 (whatever the umask), never over a file
old_umask=$(umask)
umask 000
cred keygen -o "$T/master.key"
umask "$old_umask"
is "$rc" 0 "keygen exits 0"
is "$(stat -c %a "$T/master.key" 2>/dev/null)" 600 "the master key has mode 0600 under umask 000"
is "$(stat -c %s "$T/master.key" 2>/dev/null)" 32 "the master key has 32 bytes"
sum=$(cksum <"$T/master.key")
cred keygen -o "$T/master.key"
is "$rc" 1 "keygen over an existing file exits 1"
n=$((n + 1))
if grep -q 'refusing to overwrite' "$T/err" && [ "$(cksum <"$T/master.key")" = "$sum" ]; then
    echo "ok $n - it says so and leaves the key as it was"; else echo "not ok $n - overwrite"; fi

# 6-8: issue prints one credential line
cred issue -k "$T/master.key" --tenant acme --job train-42 --epoch 3 --class spot --weight 5
is "$rc" 0 "issue exits 0"
good=$(cat "$T/out")
is "$(wc -l <"$T/out" | tr -d ' ')" 1 "one line"
re='^shoal-cred-v1:tenant=acme;job=train-42;epoch=3;class=spot;weight=5;'
re="${re}expires=[1-9][0-9]*;mac=[0-9a-f]{64}\$"
printf '%s\n' "$good" | grep -Eq "$re"
ok $? "the line has every field, an expiry and a 64-digit mac"

# 9-11: verify from stdin and from the argument
cred_in "$good" verify -k "$T/master.key"
is "$rc" 0 "verify (stdin) exits 0"
grep -q '^valid: tenant acme job train-42 epoch 3 class spot weight 5 expires 20' "$T/out"
ok $? "verify prints the fields and the expiry date"
cred verify -k "$T/master.key" "$good"
is "$rc" 0 "verify (argument) exits 0"

# 12-17: each altered field fails the MAC
for edit in 's/tenant=acme/tenant=acmf/' 's/job=train-42/job=train-43/' 's/epoch=3/epoch=4/' \
    's/class=spot/class=guaranteed/' 's/weight=5/weight=50/' 's/expires=/expires=1/'; do
    bad=$(printf '%s\n' "$good" | sed "$edit")
    cred_in "$bad" verify -k "$T/master.key"
    [ "$rc" -eq 1 ] && grep -q 'MAC does not match' "$T/err" &&
        grep -q 'credential rejected' "$T/err"
    ok $? "altered field ($edit): rejected, exit 1"
done

# 18-19: another master key; a malformed credential
cred keygen -o "$T/other.key"
cred_in "$good" verify -k "$T/other.key"
is "$rc" 1 "another provider's master key: rejected"
cred_in "shoal-cred-v1:tenant=acme;job=x" verify -k "$T/master.key"
[ "$rc" -eq 1 ] && grep -q 'truncated' "$T/err"
ok $? "a truncated credential: rejected with the reason"

# 20-22: expiry
cred issue -k "$T/master.key" --tenant acme --job old --expires @1000
expired=$(cat "$T/out")
grep -q 'warning: --expires @1000 is already past' "$T/err"; warned=$?
cred_in "$expired" verify -k "$T/master.key"
[ "$rc" -eq 1 ] && grep -q 'expired' "$T/err" && [ "$warned" -eq 0 ]
ok $? "an expired credential: issued with a warning, rejected as expired"
cred issue -k "$T/master.key" --tenant acme --job forever --expires never
cred_in "$(cat "$T/out")" verify -k "$T/master.key"
[ "$rc" -eq 0 ] && grep -q 'expires never' "$T/out"
ok $? "--expires never: valid, never expires"
cred issue -k "$T/master.key" --tenant acme --job soon --expires 60
now=$(date +%s)
exp=$(sed -n 's/.*;expires=\([0-9]*\);.*/\1/p' "$T/out")
[ -n "$exp" ] && [ "$exp" -ge $((now + 55)) ] && [ "$exp" -le $((now + 65)) ]
ok $? "--expires 60 expires in a minute"

# 23-27: per-tenant keys
cred tenant-key -k "$T/master.key" --tenant acme -o "$T/acme.key"
[ "$rc" -eq 0 ] && [ "$(stat -c %a "$T/acme.key")" = 600 ] && [ "$(stat -c %s "$T/acme.key")" = 32 ]
ok $? "tenant-key writes 32 bytes with mode 0600"
cmp -s "$T/acme.key" "$T/master.key"
is "$?" 1 "the tenant key is not the master key"
cred_in "$good" verify -K "$T/acme.key"
is "$rc" 0 "verify -K with the tenant's key: valid"
cred tenant-key -k "$T/master.key" --tenant globex -o "$T/globex.key"
cred_in "$good" verify -K "$T/globex.key"
is "$rc" 1 "verify -K with another tenant's key: rejected"
cred tenant-key -k "$T/master.key" --tenant acme -o "$T/acme.key"
is "$rc" 1 "tenant-key never overwrites"

# 28-31: key file checks
cp "$T/master.key" "$T/open.key"; chmod 644 "$T/open.key"
cred_in "$good" verify -k "$T/open.key"
[ "$rc" -eq 0 ] && grep -q 'warning: key file .* may be read by group or others' "$T/err"
ok $? "a key readable by others: a warning, still used"
chmod 646 "$T/open.key"
cred_in "$good" verify -k "$T/open.key"
[ "$rc" -eq 1 ] && grep -q 'may be written by group or others (mode 0646)' "$T/err"
ok $? "a key others may write (and so replace): refused"
head -c 31 "$T/master.key" >"$T/short.key"; chmod 600 "$T/short.key"
cred_in "$good" verify -k "$T/short.key"
[ "$rc" -eq 1 ] && grep -q 'not a regular file of 32 bytes' "$T/err"
ok $? "a 31-byte key file is refused"
cred issue -k "$T/missing.key" --tenant acme --job j
is "$rc" 1 "a missing key file: exit 1"

# 32-34: usage errors exit 2
cred issue -k "$T/master.key" --tenant acme --job j --class gold
is "$rc" 2 "issue --class gold: exit 2"
cred issue -k "$T/master.key" --tenant 'ac me' --job j
is "$rc" 1 "issue --tenant 'ac me' (not a valid name): exit 1"
cred verify -k "$T/master.key" -K "$T/acme.key" "$good"
is "$rc" 2 "verify with both -k and -K: exit 2"

# 35-36: stdin holds one credential line and nothing else, as SHOAL_CREDENTIAL_FILE must (a
# credential followed by more was reported valid; the library refuses such a file)
{ printf '%s\n' "$good"; echo more; } |
    timeout -s KILL 30 "$CRED" verify -k "$T/master.key" >"$T/out" 2>"$T/err"
is "$?" 1 "verify: a credential line followed by another line on stdin: rejected"
{ printf '%s' "$good"; printf '\000more\n'; } |
    timeout -s KILL 30 "$CRED" verify -k "$T/master.key" >"$T/out" 2>"$T/err"
is "$?" 1 "verify: a credential followed by a NUL byte and more on stdin: rejected"

# 37: a key file another user owns is refused whatever its mode: its owner may rewrite it (a
# tenant owning its tenant key minted its own credentials); it was used without a word
if [ "$(id -u)" = 0 ]; then
    cp "$T/master.key" "$T/theirs.key"; chmod 600 "$T/theirs.key"; chown 65534 "$T/theirs.key"
    cred_in "$good" verify -k "$T/theirs.key"
    [ "$rc" -eq 1 ] && grep -q 'belongs to uid 65534, neither root nor this user' "$T/err"
    ok $? "a key file (mode 0600) that another user owns: refused"
else
    n=$((n + 1)); echo "ok $n # SKIP not root: no file of another user to try"
fi

# 38-39: a credential (or verify's verdict) that cannot be written to stdout (a full disk,
# a closed pipe) is an error that says so: both exited 1 without a word, verify's 1 read as
# 'rejected' for a valid credential
if [ -w /dev/full ]; then
    timeout -s KILL 30 "$CRED" issue -k "$T/master.key" --tenant acme --job j >/dev/full \
        2>"$T/err"
    [ "$?" -eq 1 ] && grep -q 'cannot write the credential to stdout' "$T/err"
    ok $? "issue with stdout on a full device: exit 1, says it could not write"
    printf '%s\n' "$good" | timeout -s KILL 30 "$CRED" verify -k "$T/master.key" \
        >/dev/full 2>"$T/err"
    [ "$?" -eq 1 ] && grep -q 'cannot write to stdout' "$T/err" &&
        ! grep -q 'credential rejected' "$T/err"
    ok $? "verify with stdout on a full device: exit 1, says it could not write"
else
    n=$((n + 2)); echo "ok $((n - 1)) # SKIP no /dev/full"; echo "ok $n # SKIP no /dev/full"
fi

# 40: the argument as the library takes SHOAL_CREDENTIAL: one trailing newline dropped (the
# line issue prints, passed whole); it was rejected ('field mac is not 64 ... hex digits')
nl='
'
cred verify -k "$T/master.key" "$good$nl"
is "$rc" 0 "verify (argument ending in a newline, as SHOAL_CREDENTIAL may) exits 0"

# 41-42: verify says why it rejects whatever the library's log does: with SHOAL_DEBUG_FILE
# set (a provider's environment) or SHOAL_DEBUG=NONE the reason went to the file or nowhere,
# and stderr said only 'permission denied' or 'no usable key or not a credential'
printf '%s\n' "$expired" | SHOAL_DEBUG_FILE="$T/debug.log" timeout -s KILL 30 "$CRED" \
    verify -k "$T/master.key" >"$T/out" 2>"$T/err"
rc=$?
[ "$rc" -eq 1 ] && grep -q 'credential rejected: .*expired at' "$T/err"
ok $? "verify with SHOAL_DEBUG_FILE set: an expired credential, the reason on stderr"
printf '%s\n' "shoal-cred-v1:tenant=acme;job=x" | SHOAL_DEBUG=NONE timeout -s KILL 30 \
    "$CRED" verify -k "$T/master.key" >"$T/out" 2>"$T/err"
rc=$?
[ "$rc" -eq 1 ] && grep -q 'credential rejected: .*truncated' "$T/err"
ok $? "verify with SHOAL_DEBUG=NONE: a truncated credential, the reason on stderr"

# 43-45: a name the credential cannot hold is refused with the reason on stderr, whatever
# the library's log does: under SHOAL_DEBUG=NONE (or with SHOAL_DEBUG_FILE) they exited 1
# without a word
SHOAL_DEBUG=NONE timeout -s KILL 30 "$CRED" issue -k "$T/master.key" --tenant 'ac me' \
    --job j >"$T/out" 2>"$T/err"
[ "$?" -eq 1 ] && grep -q -- "--tenant .*printable ASCII" "$T/err" && [ ! -s "$T/out" ]
ok $? "issue --tenant 'ac me' under SHOAL_DEBUG=NONE: exit 1 with the reason"
SHOAL_DEBUG=NONE timeout -s KILL 30 "$CRED" issue -k "$T/master.key" --tenant acme \
    --job 'x=y' >"$T/out" 2>"$T/err"
[ "$?" -eq 1 ] && grep -q -- "--job .*printable ASCII" "$T/err" && [ ! -s "$T/out" ]
ok $? "issue --job 'x=y' under SHOAL_DEBUG=NONE: exit 1 with the reason"
SHOAL_DEBUG=NONE timeout -s KILL 30 "$CRED" tenant-key -k "$T/master.key" --tenant 'a;b' \
    -o "$T/ab.key" >"$T/out" 2>"$T/err"
[ "$?" -eq 1 ] && grep -q -- "--tenant .*printable ASCII" "$T/err" && [ ! -e "$T/ab.key" ]
ok $? "tenant-key --tenant 'a;b' under SHOAL_DEBUG=NONE: exit 1 with the reason, no file"

# 46: no output of any command above showed a key
leak=0
for k in master other acme globex; do
    hex=$(od -An -tx1 -v "$T/$k.key" | tr -d ' \n')
    part=$(printf '%s' "$hex" | cut -c1-16)
    grep -qi "$part" "$T/all" && leak=1
done
is "$leak" 0 "no output shows a key (or its first 8 bytes in hex)"
