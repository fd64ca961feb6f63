# Thin wrapper over ./dev for those who type make.
.PHONY: demo test setup build bench fuzz
demo test setup build bench fuzz:
	./dev $@
