"""``python -m fedfew``: the ``fedfew`` command."""

from fedfew.cli.main import run_command

if __name__ == "__main__":
    run_command()
