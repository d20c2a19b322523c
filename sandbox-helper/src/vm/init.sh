#!/bin/busybox sh
# cowspace guest init (the VM's first pid 1). Loads the virtio modules, mounts the
# workspace (virtio-fs tag `workspace`) at /workspace, brings up the network the kernel
# command line asks for (`cowspace.net=loopback`: lo; `cowspace.net=user`: lo and eth0
# at 10.0.2.15/24, qemu's user network, reachable only through the published ports),
# then becomes the guest agent, which serves the host over the virtio-serial port
# `cowspace.agent` until the host shuts the VM down.
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
export PATH=/bin
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts
mount -t devpts -o ptmxmode=0666,mode=0620 devpts /dev/pts
mkdir -p /tmp /workspace /root
mount -t tmpfs tmp /tmp
fail() {
    echo "cowspace-init: $*" >/dev/ttyS0
    sync
    reboot -f
}
for m in virtio_ring virtio virtio_mmio fuse virtiofs virtio_console; do
    insmod /lib/modules/$m.ko || fail "insmod $m.ko"
done
port() {
    for d in /sys/class/virtio-ports/*; do
        [ "$(cat "$d/name" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
    done
    return 1
}
tries=0
until AGENT=$(port cowspace.agent); do
    tries=$((tries + 1))
    [ $tries -gt 200 ] && fail "the virtio-serial port cowspace.agent did not appear"
    sleep 0.05
done
mount -t virtiofs workspace /workspace || fail "mount -t virtiofs workspace /workspace"
case " $(cat /proc/cmdline) " in
*" cowspace.net=loopback "*)
    ip link set lo up || fail "ip link set lo up"
    ;;
*" cowspace.net=user "*)
    ip link set lo up || fail "ip link set lo up"
    for m in failover net_failover virtio_net; do
        insmod /lib/modules/$m.ko || fail "insmod $m.ko"
    done
    tries=0
    until [ -e /sys/class/net/eth0 ]; do
        tries=$((tries + 1))
        [ $tries -gt 200 ] && fail "the network device eth0 did not appear"
        sleep 0.05
    done
    ip addr add 10.0.2.15/24 dev eth0 || fail "ip addr add 10.0.2.15/24 dev eth0"
    ip link set eth0 up || fail "ip link set eth0 up"
    ;;
esac
# --pids: every exec joins /sys/fs/cgroup/sandbox (the agent does it), whose pids.max
# is the limit; the agent itself stays outside, so a fork bomb cannot starve it.
for word in $(cat /proc/cmdline); do
    case "$word" in
    cowspace.pids=*)
        mount -t cgroup2 none /sys/fs/cgroup || fail "mount -t cgroup2"
        echo +pids > /sys/fs/cgroup/cgroup.subtree_control || fail "enable the pids controller"
        mkdir /sys/fs/cgroup/sandbox || fail "mkdir /sys/fs/cgroup/sandbox"
        echo "${word#cowspace.pids=}" > /sys/fs/cgroup/sandbox/pids.max || fail "set pids.max"
        ;;
    esac
done
cd /
exec /bin/cowspace-agent "$AGENT"
