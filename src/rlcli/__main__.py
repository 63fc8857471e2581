from rlcli.cli import train

train()
