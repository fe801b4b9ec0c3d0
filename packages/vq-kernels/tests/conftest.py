import sys
from pathlib import Path

# The suite runs with --import-mode=importlib, which leaves sys.path alone; the shared test
# builders live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))
