package intern

// Held is how many canonical copies the table holds.
func Held() int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, cs := range table {
		n += len(cs)
	}
	return n
}
