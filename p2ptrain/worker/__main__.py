from p2ptrain.worker.main import main

main()
