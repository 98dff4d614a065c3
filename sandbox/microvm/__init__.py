"""The microVM tier's parts: the guest image (`image`), QEMU's machine (`vm`), the agent inside
the guest (`guestagent`) and the host's end of its channel (`channel`), the host launcher of
one sandboxed run (`hostrun`) and the warm pool (`pool`)."""
