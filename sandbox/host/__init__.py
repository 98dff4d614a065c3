"""The host boundary: one mechanism per module (namespaces and veth, nftables, the name server,
the launch, the seccomp filter, cgroups, leases, scratch, the watchdog); no tier, daemon or
client here."""
