#!/bin/bash
# A small VM with Soft-RoCE (rdma_rxe) for the verbs transport's tests, built from Debian's
# packages and booted under qemu's software emulation (TCG: /dev/kvm on some hosts is a
# paravirtual variant that hangs a stock kernel; -smp 1 is as fast as 2 under TCG).
#
#   tests/vm/vm.sh image            builds (or reuses) the kernel and the initramfs in the cache
#   tests/vm/vm.sh run [-t SECS] [-s DIR]... -- CMD...
#                                   boots the VM, runs CMD (bash -c) inside with the checkout
#                                   and every -s DIR shared in through 9p at their own paths,
#                                   prints its output, exits with its exit status (124: timed
#                                   out, 125: the VM failed to boot or to report)
#   tests/vm/vm.sh check            exit 0 if this machine can build and boot the VM, else 77
#                                   with the reason on stdout
#
# The cache (SHOAL_VM_CACHE, default /var/cache/shoal-vm) holds the kernel (vmlinuz), the
# initramfs (initrd.cpio: a debootstrap'ed bookworm root with rdma-core, ibverbs-providers,
# perftest, UCX, iproute2, kmod, nftables, plus the kernel modules rdma_rxe, rdma_ucm, veth, 9p, and
# the tc section's qdiscs, classifiers, bridge and nf_tables need) and a
# stamp; it is rebuilt when build_image below or the package list change. The guest's /init
# (tests/vm/init.sh) is not cached: every run appends it to the initramfs as a second archive.
# Needs (as root, for debootstrap): qemu-system-x86, debootstrap, cpio, kmod (scripts/deps.sh).
# Every step has a timeout; the VM is killed on any exit of this script (trap).
# SHOAL_VM_ICOUNT=N: qemu's -icount shift=N: the guest's clock advances 2^N ns per emulated
# instruction while it runs, so timings inside measure emulated work, not the host's load
# (the perf section: ib_write_bw 4.47 and 4.50 MB/s in two rounds at host load 19-28, where
# without it the same run gave 10.7 and 24.7 at load 4-11). Unset: the guest's clock is
# the host's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cache=${SHOAL_VM_CACHE:-/var/cache/shoal-vm}
mirror=${SHOAL_VM_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
guest_pkgs="libibverbs1,ibverbs-providers,rdma-core,libssl3,libucx0,ucx-utils,perftest,iproute2,kmod,procps,ibverbs-utils,nftables"
# tc section (guest_tc.sh): shoal-tc.sh's htb tree with fq leaves, its three classifiers
# (u32, basic with the meta ematch, fw), the bridge of tests/netns/netns_lib.sh and nftables
# for the marks by uid
guest_mods="rdma_rxe rdma_ucm crc32_generic veth 9p 9pnet_virtio virtio_pci ipv6
    sch_htb sch_fq sch_fq_codel sch_sfq cls_u32 cls_basic em_meta cls_fw bridge nf_tables"
vm_mem=${SHOAL_VM_MEM:-3072}

die() {
    echo "vm.sh: $*" >&2
    exit 125
}

# The stamp: what the image was built from.
image_stamp() {
    { declare -f build_image; echo "$guest_pkgs $guest_mods $suite"; } | sha256sum | cut -c1-16
}

# "" if the VM can be built and booted here, else the reason.
why_not() {
    [ "$(uname -m)" = x86_64 ] || { echo "not an x86_64 host"; return; }
    command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 not installed"; return; }
    if [ ! -f "$cache/stamp" ] || [ "$(cat "$cache/stamp")" != "$(image_stamp)" ]; then
        [ "$(id -u)" = 0 ] || { echo "no cached image in $cache and not root (debootstrap)"; return; }
        command -v debootstrap >/dev/null || { echo "debootstrap not installed"; return; }
        command -v cpio >/dev/null || { echo "cpio not installed"; return; }
    fi
    echo ""
}

build_image() {
    local stamp tmp kdeb kver root mods
    stamp=$(image_stamp)
    if [ -f "$cache/stamp" ] && [ "$(cat "$cache/stamp")" = "$stamp" ] &&
        [ -f "$cache/vmlinuz" ] && [ -f "$cache/initrd.cpio" ]; then
        return 0
    fi
    mkdir -p "$cache" || die "cannot create $cache"
    tmp=$(mktemp -d "$cache/build.XXXXXX") || die "mktemp in $cache"
    # shellcheck disable=SC2064 # expand now
    trap "rm -rf '$tmp'" EXIT
    echo "vm.sh: building the image in $cache (debootstrap $suite, about a minute)" >&2
    # The kernel: linux-image-amd64's current image package, unpacked (not installed).
    kdeb=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/\1/p' | head -1)
    [ -n "$kdeb" ] || die "apt-cache does not know linux-image-amd64 (apt-get update?)"
    (cd "$tmp" && timeout 300 apt-get download -q "$kdeb" >/dev/null) ||
        die "apt-get download $kdeb failed"
    mkdir "$tmp/k"
    dpkg-deb -x "$tmp"/"$kdeb"_*.deb "$tmp/k" || die "dpkg-deb -x $kdeb"
    kver=$(ls "$tmp/k/lib/modules" | head -1)
    depmod -b "$tmp/k" "$kver" || die "depmod -b (kernel $kver)"
    # The root: minbase plus the RDMA user space; docs, locales and apt's lists dropped.
    root=$tmp/root
    timeout 900 debootstrap --variant=minbase --include="$guest_pkgs" "$suite" "$root" \
        "$mirror" > "$tmp/debootstrap.log" 2>&1 ||
        { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
    rm -rf "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale \
        "$root"/usr/share/info "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/*
    # Only the modules the tests need, with their dependencies (rxe loads crc32 at run time
    # without saying so: crc32_generic is listed by hand).
    mods=$(for m in $guest_mods; do
        modprobe -d "$tmp/k" -S "$kver" --show-depends "$m" 2>/dev/null
    done | awk '$1 == "insmod" { print $2 }' | sort -u)
    [ -n "$mods" ] || die "no modules found for $guest_mods in kernel $kver"
    for f in $mods; do
        rel=${f#"$tmp/k"}
        mkdir -p "$root$(dirname "$rel")"
        cp "$f" "$root$rel"
    done
    cp "$tmp/k/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} \
        "$root/lib/modules/$kver/" 2>/dev/null
    depmod -b "$root" "$kver" || die "depmod -b for the guest root"
    (cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) > "$tmp/initrd.cpio" ||
        die "cpio"
    cp "$tmp/k/boot/vmlinuz-$kver" "$tmp/vmlinuz"
    mv "$tmp/vmlinuz" "$cache/vmlinuz"
    mv "$tmp/initrd.cpio" "$cache/initrd.cpio"
    echo "$stamp" > "$cache/stamp"
    echo "vm.sh: image ready: kernel $kver, initramfs $(du -m "$cache/initrd.cpio" | cut -f1) MiB" >&2
    rm -rf "$tmp"
    trap - EXIT
}

qemu_pid=""
rundir=""
kill_vm() {
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill "$qemu_pid" 2>/dev/null
        sleep 1
        kill -9 "$qemu_pid" 2>/dev/null
    fi
    qemu_pid=""
    [ -n "$rundir" ] && rm -rf "$rundir"
}

run_vm() {
    local secs=${SHOAL_VM_TIMEOUT:-600} shares="$top" i=0 virtfs=() tags="" rc
    while [ $# -gt 0 ]; do
        case $1 in
        -t) secs=$2; shift 2 ;;
        -s) shares="$shares $(cd "$2" && pwd)"; shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    [ $# -gt 0 ] || die "run: no command"
    build_image
    rundir=$(mktemp -d "${TMPDIR:-/tmp}/shoal-vm.XXXXXX") || die "mktemp"
    trap kill_vm EXIT
    trap 'kill_vm; exit 130' INT TERM
    shares="$shares $rundir"
    for s in $shares; do
        virtfs+=(-virtfs "local,path=$s,mount_tag=s$i,security_model=none,readonly=off")
        tags="$tags,s$i=$s"
        i=$((i + 1))
    done
    printf '%s\n' "$*" > "$rundir/cmd"
    mkdir "$rundir/i" && install -m 755 "$here/init.sh" "$rundir/i/init" &&
        (cd "$rundir/i" && echo init | cpio -o -H newc --quiet) > "$rundir/init.cpio" &&
        cat "$cache/initrd.cpio" "$rundir/init.cpio" > "$rundir/initrd" ||
        die "cannot write the initramfs into $rundir"
    rm -rf "$rundir/i" "$rundir/init.cpio"
    # The guest's init (tests/vm/init.sh) mounts every share at its host path, runs cmd with
    # bash, writes the output to $rundir/out and the exit status to $rundir/rc, powers off.
    # shellcheck disable=SC2086 # empty or two words
    qemu-system-x86_64 -accel tcg -smp 1 -m "$vm_mem" ${SHOAL_VM_ICOUNT:+-icount shift=$SHOAL_VM_ICOUNT} \
        -nodefaults -no-user-config \
        -display none -serial "file:$rundir/console" -monitor none -nic none -no-reboot \
        -kernel "$cache/vmlinuz" -initrd "$rundir/initrd" \
        -append "console=ttyS0 panic=-1 quiet loglevel=3 shoal.run=$rundir shoal.shares=${tags#,}" \
        "${virtfs[@]}" &
    qemu_pid=$!
    local t0=$SECONDS
    while kill -0 "$qemu_pid" 2>/dev/null; do
        if [ $((SECONDS - t0)) -ge "$secs" ]; then
            echo "vm.sh: the VM ran past $secs s: killed" >&2
            [ -f "$rundir/out" ] && cat "$rundir/out"
            tail -20 "$rundir/console" >&2
            kill_vm
            return 124
        fi
        sleep 1
    done
    wait "$qemu_pid"
    qemu_pid=""
    [ -f "$rundir/out" ] && cat "$rundir/out"
    if [ ! -f "$rundir/rc" ]; then
        echo "vm.sh: the VM stopped without an exit status; its console:" >&2
        tail -40 "$rundir/console" >&2
        return 125
    fi
    rc=$(cat "$rundir/rc")
    echo "vm.sh: the command exited $rc after $((SECONDS - t0)) s in the VM" >&2
    return "$rc"
}

case ${1:-} in
image)
    why=$(why_not)
    [ -z "$why" ] || die "$why"
    build_image
    ;;
check)
    why=$(why_not)
    [ -z "$why" ] || { echo "$why"; exit 77; }
    ;;
run)
    shift
    why=$(why_not)
    [ -z "$why" ] || die "$why"
    run_vm "$@"
    exit $?
    ;;
*)
    echo "usage: $0 image | check | run [-t SECS] [-s DIR]... -- CMD..." >&2
    exit 2
    ;;
esac
