"""The microVM tier's host side: the tier itself (`tier`), the guest image (`image`), QEMU's
machine (`vm`), the host's end of the guest agent's channel (`channel`), the host launchers of
one sandboxed run (`hostrun`) and of a sandboxd slot (`hostserve`), and the warm pool (`pool`).
What runs in the guest (its agent, `/init`) is `sandbox.guest`'s; the frames both ends speak
are `sandbox.guest.protocol`'s."""
