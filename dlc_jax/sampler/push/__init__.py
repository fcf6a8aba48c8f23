"""Receiving weight pushes: whole, sliced and adapter pushes, staging, checks, the data plane
and the relay."""
