"""Attention and small ops. Each Triton kernel lives beside a plain-torch reference of the
same function (same signature, same semantics); tests compare the two."""
