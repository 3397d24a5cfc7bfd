"""Fleet: tailgate across many hosts on Ray (distributed bench, fleet inspection)."""
