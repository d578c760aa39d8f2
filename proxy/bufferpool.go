package proxy

import "sync"

// bufferPool recycles ReverseProxy's copy buffers; without one it allocates
// 32 KiB for every response.
type bufferPool struct{ pool sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any {
		b := make([]byte, 32<<10)
		return &b
	}}}
}

func (p *bufferPool) Get() []byte { return *p.pool.Get().(*[]byte) }

func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }
