from ladbench.cli import main

main()
