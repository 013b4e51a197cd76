"""The planners: pure functions from observed facts and a request to a plan."""
