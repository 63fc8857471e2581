from rlcli.entry.cli import train

train()
