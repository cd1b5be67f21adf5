from tapeout.cli import main

main()
