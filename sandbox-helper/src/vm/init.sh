#!/bin/busybox sh
# cowspace guest init (pid 1 of the VM). Loads the virtio modules, mounts the workspace
# (virtio-fs tag `workspace`) at /workspace, then talks to the host over three
# virtio-serial ports: on `cowspace.ctl` it writes `ready`, reads the command script
# (a decimal byte count on one line, then that many bytes), runs it with stdout on
# `cowspace.stdout` and stderr on `cowspace.stderr`, syncs and unmounts the workspace,
# writes `exit N`, waits for the host's `bye`, and reboots (which ends qemu).
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
export PATH=/bin
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /workspace /root
mount -t tmpfs tmp /tmp
fail() {
    echo "cowspace-init: $*" >/dev/ttyS0
    [ -n "$CTL" ] && echo "error $*" >&3
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
until CTL=$(port cowspace.ctl) && OUT=$(port cowspace.stdout) && ERR=$(port cowspace.stderr); do
    tries=$((tries + 1))
    [ $tries -gt 200 ] && fail "the virtio-serial ports did not appear"
    sleep 0.05
done
exec 3<>"$CTL"
mount -t virtiofs workspace /workspace || fail "mount -t virtiofs workspace /workspace"
case " $(cat /proc/cmdline) " in *" cowspace.net=loopback "*) ip link set lo up || fail "ip link set lo up" ;; esac
echo ready >&3
read -r n <&3 || fail "no command from the host"
dd bs=1 count="$n" of=/tmp/cmd.sh <&3 2>/dev/null || fail "reading the command"
cd /workspace
HOME=/root sh /tmp/cmd.sh </dev/null >"$OUT" 2>"$ERR"
st=$?
cd /
sync
umount /workspace || fail "umount /workspace"
echo "exit $st" >&3
read -r bye <&3
reboot -f
