from lightning_tune_data.cli import main

main()
