from stasis.cli import main

main()
