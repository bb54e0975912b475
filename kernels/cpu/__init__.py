"""The CPU backend: portable torch code, registered on the `CPU` dispatch key.

Every op runs torch's own CPU kernel on canonical shapes (tiling.py), except the elementwise ops
whose torch kernel rounds differently by position (pointwise.py) and the paged attention
(attention.py), which has its own fixed-split algorithm.
"""
