"""What probescope reads of the machine it runs on: processes (procfs) and the running kernel."""
