#!/sealgate/busybox sh
# The guest's PID 1 until the agent replaces it: the kernel's filesystems, the modules (the
# kernel has virtio, 9p and its network as modules), the host's /usr read-only over 9p where
# shared, then the agent. A failure reboots the guest, which ends the VM (-no-reboot): the host sees the VM end before it is ready.
# Nothing is mounted with setuid or file capabilities honoured (nosuid: the shared /usr has
# setuid-root programs), nor device nodes but devtmpfs's; the root itself (the initramfs) is
# made read-only by the agent once the host has staged its files, before any command runs, so
# a command writes only to the scratch places mounted here: /tmp, /var/tmp, /home, /workspace.
B=/sealgate/busybox
fail() { echo "sealgate guest init: $*" > /dev/hvc0; $B reboot -f; }
$B mount -t devtmpfs -o nosuid,noexec dev /dev || fail "devtmpfs"
$B mount -t proc -o nosuid,nodev,noexec proc /proc || fail "proc"
# The terminals of commands run with one (/dev/ptmx, devtmpfs's, opens this instance).
$B mkdir -p /dev/pts
$B mount -t devpts -o nosuid,noexec,mode=0620,ptmxmode=0666 devpts /dev/pts || fail "devpts"
# The guest's boot line names nothing of the host's but its TSC rate under emulation; it reads
# empty as on the other tiers.
$B mount --bind /sealgate/empty /proc/cmdline || fail "/proc/cmdline"
$B mount -t sysfs -o nosuid,nodev,noexec sys /sys || fail "sysfs"
# A group per command (the agent's): what a command starts cannot leave it, so it can all be
# killed. favordynmods: a move between groups (the agent's, twice per command) is cheap.
$B mount -t cgroup2 -o nosuid,nodev,noexec,favordynmods cgroup2 /sys/fs/cgroup || fail "cgroup2"
while read -r m; do $B insmod "/sealgate/modules/$m" || fail "insmod $m"; done < /sealgate/modules/order
# The host's /usr where the host shares it (a host-root sandbox's); a VM from an image has no
# share: its initramfs holds the agent's own Python there, and nothing of the host's is mounted
# (QEMU can then save the VM). Read-only and never changed underneath: the guest may cache.
if $B grep -qsx usr /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag; then
    $B mount -t 9p -o trans=virtio,version=9p2000.L,ro,nosuid,nodev,cache=loose,msize=512000 usr /usr || fail "9p /usr"
fi
$B mount -t tmpfs -o mode=1777,nosuid,nodev tmp /tmp || fail "tmpfs /tmp"
$B mount -t tmpfs -o mode=1777,nosuid,nodev var-tmp /var/tmp || fail "tmpfs /var/tmp"
# The agent makes each command's home here, and stages files in /run (root's).
$B mount -t tmpfs -o mode=755,nosuid,nodev home /home || fail "tmpfs /home"
$B mount -t tmpfs -o mode=755,nosuid,nodev run /run || fail "tmpfs /run"
# The workspace, when the host shares one: written through as the run's uid.
if $B grep -qsx workspace /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag; then
    $B mount -t 9p -o trans=virtio,version=9p2000.L,nosuid,nodev,msize=512000 workspace /workspace || fail "9p /workspace"
fi
$B ip link set lo up
$B hostname sandbox
# The agent is the package guest in /sealgate (-I puts no script's directory on the path),
# with no_new_privs, which every command inherits: no exec gains a privilege, whatever mount
# its program is on.
exec $B setpriv --nnp /usr/bin/python3 -I -S -c 'import sys; sys.path.insert(0, "/sealgate"); from guest.vmagent import main; main()'
