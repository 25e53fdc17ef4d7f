"""Prints each word of a text file with how often it appears."""
import sys

from wordcount import count_words


def main():
    counts = count_words(sys.argv[1])
    for word, count in counts.items():
        print(word, count)


if __name__ == "__main__":
    main()
