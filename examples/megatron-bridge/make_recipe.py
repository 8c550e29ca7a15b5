"""Import a launch script of this directory into an attune recipe: `python make_recipe.py SCRIPT.sh [recipe.yaml]`.

The script's `exec` line is the command (as the launcher receives it) and its `export` lines its environment, so the
recipe carries the launch verbatim; `attune tune recipe.yaml --backend sim --budget 20` then tunes it on the simulator
(Megatron) and `attune render` prints the tuned launch.
"""

import re
import shlex
import sys
from pathlib import Path

import yaml

from attune import frameworks
from attune.recipe.io import parse_recipe, recipe_to_dict

here = Path(__file__).resolve().parent
script = Path(sys.argv[1]) if len(sys.argv) > 1 else min(here.glob("*.sh"))
text = re.sub(r"\\\n", " ", script.read_text())
argv = next(shlex.split(line)[1:] for line in text.splitlines() if line.startswith("exec "))
env = dict(re.findall(r"^export (\w+)=(\S+)$", text, flags=re.MULTILINE))
recipe = parse_recipe(frameworks.get("megatron").import_launch(argv, cwd=here, env=env), str(script))
out = Path(sys.argv[2]) if len(sys.argv) > 2 else here / "recipe.yaml"
out.write_text(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))
print(f"wrote {out}: attune tune {out} --backend sim --budget 20")
