"""payload"""
