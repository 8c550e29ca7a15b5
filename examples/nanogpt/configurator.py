"""nanoGPT's "Poor Man's Configurator" (karpathy/nanoGPT, configurator.py), kept as nanoGPT ships it.

Run from train.py with ``exec(open('configurator.py').read())``: every ``--key=value`` argument overrides a global of
train.py (the value read with ``ast.literal_eval``, else kept as a string, and its type must match the default's);
any other argument names a config file (Python) executed over the globals. ``--key value`` (with a space) is an error:
nanoGPT reads only the ``=`` form.
"""
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if '=' not in arg:
        # assume it's the name of a config file
        assert not arg.startswith('--')
        config_file = arg
        print(f"Overriding config with {config_file}:")
        with open(config_file) as f:
            print(f.read())
        exec(open(config_file).read())  # noqa: SIM115 - nanoGPT's line, kept
    else:
        # assume it's a --key=value argument
        assert arg.startswith('--')
        key, val = arg.split('=')
        key = key[2:]
        if key in globals():
            try:
                # attempt to eval it it (e.g. if bool, number, or etc)
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                # if that goes wrong, just use the string
                attempt = val
            # ensure the types match ok
            assert type(attempt) == type(globals()[key])  # noqa: E721 - nanoGPT's line, kept
            # cross fingers
            print(f"Overriding: {key} = {attempt}")
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")
