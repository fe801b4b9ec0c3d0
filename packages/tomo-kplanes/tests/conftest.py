import sys
from pathlib import Path

# --import-mode=importlib leaves sys.path alone; the shared test helpers live beside the tests
sys.path.insert(0, str(Path(__file__).parent))
