print("attune")
