"""course_lib: every technique of the Scaling Deep Learning course, implemented for real.

One module per technique; notebooks import from here instead of pasting code.
"""
import atexit
import gc

from .env import dist_info, get_device, quick_mode, seed_everything

__all__ = ["dist_info", "get_device", "quick_mode", "seed_everything"]
__version__ = "0.1.0"

# At exit Python's last garbage collections walk every object torch created: about 1 CPU-s in each process
# that imported it (torch 2.14, Python 3.11; a kernel's shutdown 1.7 s -> 0.5 s). The process is ending and
# frees them all anyway, so they are moved out of the collector's sight first (atexit runs before that).
atexit.register(gc.freeze)
