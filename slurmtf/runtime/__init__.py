"""What runs inside the allocation: the launchers and the decision after each step."""
