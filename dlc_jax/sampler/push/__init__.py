"""Weight pushes: whole, sliced and adapter pushes, staging, checks, data plane and relay."""
