"""course_lib: every technique of the Scaling Deep Learning course, implemented for real.

One module per technique; notebooks import from here instead of pasting code.
"""
import atexit

from . import shutdown
from .env import dist_info, get_device, quick_mode, seed_everything

__all__ = ["dist_info", "get_device", "quick_mode", "seed_everything"]
__version__ = "0.1.0"

atexit.register(shutdown.freeze_at_exit)   # no final garbage collection over torch's objects (shutdown.py)
