"""dcaforge: a numbered patch series and a templated feature on top of llama.cpp, in a clean room."""

from pathlib import Path

__version__ = "0.1.0"

#: The repository dcaforge is installed from (the package lives inside it).
REPO_ROOT = Path(__file__).resolve().parent.parent
