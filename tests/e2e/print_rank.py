"""Prints the rank environment ddprun gives a Python script (e2e.ddprun_python)."""
import os
import sys

print(f"python rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} args {sys.argv[1:]}")
