"""The harness: drives the product from outside. Local swarms (with or without the control plane,
on loopback or inside the WAN testbed), benchmarks and the hivemind baseline they compare with.

It may import anything (the product, the testbed, torch, hivemind in the processes it starts);
nothing in the product imports it.
"""
