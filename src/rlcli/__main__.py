from rlcli.train import main

main()
