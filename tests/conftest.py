"""Shared test set-up. Keep it minimal: fixtures belong in the module that uses them."""

import pathlib
import sys

# Test helpers (fake_engine.py) are imported as top-level modules.
sys.path.insert(0, str(pathlib.Path(__file__).parent))
