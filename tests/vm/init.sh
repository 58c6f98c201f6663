#!/bin/bash
# /init of the Soft-RoCE VM (tests/vm/vm.sh puts it in the initramfs): mounts the 9p shares at
# their host paths, builds the two-"host" RDMA fabric (a veth pair, rxe0 on veth0 and rxe1 on
# veth1, both in the initial network namespace: on 6.1 an rxe device's UDP socket lives only
# there), runs the command from the run folder and powers off.
#
# Both ends' addresses are local to the one namespace, so the kernel would deliver a packet
# from 10.71.0.1 to 10.71.0.2 through lo, where rxe finds no device (and address resolution
# times out). rxe-routes makes each end reach the other through the veth pair instead: the
# local table moves behind rules that send locally made packets for the other end to a table
# routing them out of this end's veth, with static neighbours and accept_local. Taking a veth
# down flushes its routes: run rxe-routes again after bringing it up.
export PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp LANG=C
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts devpts /dev/pts
ln -sf /proc/self/fd /dev/fd
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
ulimit -l unlimited
ulimit -n 65536

for arg in $(cat /proc/cmdline); do
    case $arg in
    shoal.run=*) run=${arg#shoal.run=} ;;
    shoal.shares=*) shares=${arg#shoal.shares=} ;;
    esac
done
modprobe -a virtio_pci 9pnet_virtio 9p
for s in ${shares//,/ }; do
    mkdir -p "${s#*=}"
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none "${s%%=*}" "${s#*=}" ||
        echo "init: mounting ${s%%=*} at ${s#*=} failed"
done
# shellcheck disable=SC2154 # set from the kernel command line
out=$run/out

mkdir -p /usr/local/sbin
cat > /usr/local/sbin/rxe-routes <<'EOS'
#!/bin/bash
m0=$(cat /sys/class/net/veth0/address)
m1=$(cat /sys/class/net/veth1/address)
for c in all veth0 veth1; do
    sysctl -qw net.ipv4.conf.$c.accept_local=1 net.ipv4.conf.$c.rp_filter=0
done
for f in -4 -6; do
    ip $f rule show pref 100 | grep -q . || ip $f rule add pref 100 lookup local
    ip $f rule del pref 0 lookup local 2>/dev/null
done
for h in 0 1; do
    o=$((1 - h))
    mo=$m1
    [ $o = 0 ] && mo=$m0
    ip -4 rule show pref 10 | grep -q "to 10.71.0.$((o + 1)) " ||
        ip -4 rule add pref 10 iif lo to 10.71.0.$((o + 1)) lookup $((100 + h))
    ip -6 rule show pref 10 | grep -q "to fd71::$((o + 1)) " ||
        ip -6 rule add pref 10 iif lo to fd71::$((o + 1)) lookup $((100 + h))
    ip -4 route replace 10.71.0.$((o + 1)) dev veth$h src 10.71.0.$((h + 1)) table $((100 + h))
    ip -6 route replace fd71::$((o + 1)) dev veth$h table $((100 + h))
    ip -4 neigh replace 10.71.0.$((o + 1)) lladdr "$mo" dev veth$h nud permanent
    ip -6 neigh replace fd71::$((o + 1)) lladdr "$mo" dev veth$h nud permanent
done
EOS
chmod 755 /usr/local/sbin/rxe-routes

fabric() {
    modprobe -a crc32_generic rdma_rxe veth || return 1
    modprobe rdma_ucm || echo "init: no rdma_ucm: rdma_cm (SHOAL_IB_USE_RDMACM) cannot work"
    ip link set lo up
    ip link add veth0 type veth peer name veth1 || return 1
    ip addr add 10.71.0.1/24 dev veth0
    ip addr add 10.71.0.2/24 dev veth1
    ip -6 addr add fd71::1/64 dev veth0 nodad
    ip -6 addr add fd71::2/64 dev veth1 nodad
    ip link set veth0 up
    ip link set veth1 up
    rxe-routes || return 1
    rdma link add rxe0 type rxe netdev veth0 || return 1
    rdma link add rxe1 type rxe netdev veth1 || return 1
    for i in $(seq 50); do # the ports go ACTIVE once the links are up
        if grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state &&
            grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}

if [ -z "${run:-}" ] || [ ! -f "$run/cmd" ]; then
    echo "init: no run folder (shoal.run=${run:-}) or no command in it"
elif ! fabric > "$run/fabric.log" 2>&1; then
    cat "$run/fabric.log" > "$out"
    echo "init: building the rxe fabric failed" >> "$out"
    echo 125 > "$run/rc"
else
    cd "$(dirname "$run")" || cd /
    bash "$run/cmd" > "$out" 2>&1 < /dev/null
    echo $? > "$run/rc.tmp"
    mv "$run/rc.tmp" "$run/rc"
fi
sync
echo o > /proc/sysrq-trigger
sleep 10
