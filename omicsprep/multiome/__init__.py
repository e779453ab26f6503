"""Modalities of one sample joined into a MuData, with a weighted nearest neighbour (WNN) graph."""
