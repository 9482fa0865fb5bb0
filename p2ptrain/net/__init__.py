"""py-libp2p plumbing for the control plane: host factory, framing and the probe/RPC protocols."""
