"""Distributed training from first principles: launching, collectives, DataParallel, DDP, multi-node.

Worker functions that run in spawned processes live in `workers.py` (and in the technique
modules), never in notebooks: a spawned process can only import a function by module name.
"""
