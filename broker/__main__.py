from broker.console import main

main()
