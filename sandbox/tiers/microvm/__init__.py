"""The microVM tier's parts: the guest image (`image`), QEMU's machine (`vm`), the agent inside
the guest (`guestagent`, with `guestos`) and the frames of its channel (`frames`), the host's
end of that channel (`channel`), the host launchers of one sandboxed run (`hostrun`) and of a
sandboxd slot (`hostserve`), and the warm pool (`pool`)."""
